// Tokenizes strings with llama.cpp's own tokenizer (through the node-llama-cpp bindings, prebuilt
// CPU binary), for the reference fixtures. Not used by tests.
//
//   NODE_LLAMA_DIR=/tmp/nodellama node scripts/reference/llamacpp_tokenize.mjs MODEL.gguf < in.json > out.json
//
// in.json: a JSON array of strings. out.json: a JSON array of token-id arrays, with special
// tokens written in the text parsed as special tokens (llama.cpp parse_special = true) and no
// BOS/EOS added. NODE_LLAMA_DIR is a folder where `npm install node-llama-cpp@3.22.1` was run.
import { createRequire } from "node:module";
import { readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";

const dir = process.env.NODE_LLAMA_DIR;
if (!dir) throw new Error("set NODE_LLAMA_DIR to the folder with node_modules/node-llama-cpp");
const require = createRequire(dir.replace(/\/?$/, "/"));
const entry = require.resolve("node-llama-cpp");
const { getLlama } = await import(pathToFileURL(entry).href);

const llama = await getLlama({ gpu: false, build: "never", logLevel: "error" });
const model = await llama.loadModel({ modelPath: process.argv[2], vocabOnly: true });
const texts = JSON.parse(readFileSync(0, "utf8"));
// tokenize(text, specialTokens=true): special tokens in the text are recognised; llama.cpp adds
// BOS only when the vocab says so (SmolLM2: add_bos_token = false), which we check below.
const out = texts.map((t) => Array.from(model.tokenize(t, true)));
process.stdout.write(JSON.stringify(out));
