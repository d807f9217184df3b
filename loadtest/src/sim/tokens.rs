//! The simulated worker's tokenizer: deterministic, cheap, and deliberately not the proxy's
//! estimator (words of up to six characters are one token, longer words one more per six;
//! every symbol and CJK character is a token), so the proxy's online recalibration has real
//! work to do against simulated workers.

/// Prompt tokens before the query: system line, instruction and field labels.
pub const TEMPLATE_HEAD_TOKENS: u32 = 40;
/// Tokens after each item: the end of the user turn and the assistant header.
pub const TEMPLATE_TAIL_TOKENS: u32 = 10;

pub fn count_tokens(text: &str) -> u32 {
    let mut tokens = 0u32;
    let mut word = 0u32;
    if text.is_ascii() {
        for &b in text.as_bytes() {
            if b.is_ascii_alphanumeric() {
                word += 1;
                continue;
            }
            tokens += word_tokens(word) + u32::from(!(b as char).is_whitespace());
            word = 0;
        }
        return tokens + word_tokens(word);
    }
    for c in text.chars() {
        if c.is_alphanumeric() && !is_cjk(c) {
            word += 1;
            continue;
        }
        tokens += word_tokens(word);
        word = 0;
        if !c.is_whitespace() {
            tokens += 1;
        }
    }
    tokens + word_tokens(word)
}

fn word_tokens(chars: u32) -> u32 {
    if chars == 0 {
        0
    } else {
        1 + (chars - 1) / 6
    }
}

fn is_cjk(c: char) -> bool {
    matches!(c as u32, 0x3040..=0x30FF | 0x3400..=0x4DBF | 0x4E00..=0x9FFF | 0xAC00..=0xD7AF | 0xF900..=0xFAFF)
}

/// Tokens of the prefix every prompt of a call shares: template head, instruction, query.
pub fn prefix_tokens(query: &str, instruction: Option<&str>) -> u32 {
    TEMPLATE_HEAD_TOKENS + instruction.map_or(0, count_tokens) + count_tokens(query)
}

/// Tokens of an item's own segment: its text and the template tail.
pub fn item_tokens(text: &str) -> u32 {
    count_tokens(text) + TEMPLATE_TAIL_TOKENS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_words_symbols_and_cjk() {
        assert_eq!(count_tokens(""), 0);
        assert_eq!(count_tokens("red shoes"), 2);
        assert_eq!(count_tokens("waterproofing"), 3); // 13 chars: 1 + 12/6
        assert_eq!(count_tokens("size: 42, red!"), 6);
        assert_eq!(count_tokens("跑步鞋"), 3);
        assert_eq!(item_tokens("red shoes"), 2 + TEMPLATE_TAIL_TOKENS);
        assert_eq!(prefix_tokens("red shoes", Some("rank")), TEMPLATE_HEAD_TOKENS + 3);
    }
}
