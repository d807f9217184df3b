//! Everything a running proxy shares between requests, the admin port and its background
//! tasks. Built once at start-up and passed down; nothing global but the metrics recorder.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use metrics_exporter_prometheus::PrometheusHandle;
use sieve_server::http::ByteBudget;
use sieve_shared::sync::lock;
use sieve_shared::{CostModel, ProxyConfig};
use tokio::sync::Notify;

use crate::balancer::{self, Policy};
use crate::client::HttpClient;
use crate::cluster::budget::TokenBucket;
use crate::cluster::pool::WorkerPool;
use crate::cluster::worker::ViewParams;
use crate::drain::Drain;
use crate::estimate::answer_margin::AnswerMargin;
use crate::estimate::cost_estimator::CostEstimator;
use crate::estimate::latency_ratio::RatioTracker;
use crate::estimate::token_estimator::TokenEstimator;
use crate::pair_cache::PairCache;
use crate::prefix_holders::PrefixHolders;
use crate::request_trace::Trace;
use crate::split::{self, SplitPolicy};

/// Most retries saved up; and the hedge allowance cap, in ms of predicted work.
const RETRY_BUCKET_CAPACITY: f64 = 100.0;
const HEDGE_BUCKET_CAPACITY_MS: f64 = 10_000.0;

pub struct AppState {
    config: ArcSwap<ProxyConfig>,
    policy: ArcSwap<Arc<dyn Policy>>,
    split: ArcSwap<Arc<dyn SplitPolicy>>,
    pub pool: WorkerPool,
    pub client: HttpClient,
    pub tokens: Mutex<TokenEstimator>,
    pub cost: Mutex<CostEstimator>,
    pub retry_budget: TokenBucket,
    pub hedge_budget: TokenBucket,
    pub ratios: RatioTracker,
    /// What a shard's answer needs after its worker's deadline: kept from the worker's.
    pub answer_margin: AnswerMargin,
    /// Scores of pairs already answered (`[cache]`).
    pub pair_cache: PairCache,
    /// Which workers hold which prefixes, learnt from their answers (`[split] prefix_affinity`).
    pub prefix_holders: PrefixHolders,
    /// The sampled request trace (`[request_trace]`; off until `start` opens it).
    pub request_trace: Trace,
    pub drain: Drain,
    /// Wakes the health checker at once (workers were added).
    pub health_wake: Notify,
    pub metrics: PrometheusHandle,
    pub started: Instant,
    /// Request bytes held in memory, the API and gRPC ports together (`[http]
    /// max_buffered_bytes`, fixed at start).
    pub buffer_budget: ByteBudget,
}

impl AppState {
    pub fn new(config: ProxyConfig, metrics: PrometheusHandle) -> Self {
        AppState {
            policy: ArcSwap::from_pointee(balancer::build(&config.balance)),
            split: ArcSwap::from_pointee(split::build(&config.split)),
            pool: WorkerPool::default(),
            client: HttpClient::new(&config.client),
            tokens: Mutex::new(TokenEstimator::new(&config.estimator)),
            cost: Mutex::new(CostEstimator::new(config.cost, &config.estimator)),
            retry_budget: TokenBucket::new(
                RETRY_BUCKET_CAPACITY,
                config.retry.budget_min_per_sec,
                config.retry.budget_min_per_sec,
            ),
            hedge_budget: TokenBucket::new(HEDGE_BUCKET_CAPACITY_MS, 0.0, 0.0),
            ratios: RatioTracker::new(config.hedge.quantile),
            answer_margin: AnswerMargin::default(),
            pair_cache: PairCache::new(&config.cache),
            prefix_holders: PrefixHolders::new(&config.split),
            request_trace: Trace::off(),
            drain: Drain::default(),
            health_wake: Notify::new(),
            metrics,
            started: Instant::now(),
            buffer_budget: ByteBudget::new(config.http.max_buffered_bytes),
            config: ArcSwap::from_pointee(config),
        }
    }

    pub fn config(&self) -> Arc<ProxyConfig> {
        self.config.load_full()
    }

    /// Applies a reloaded config to everything that can change while running: the balancing and
    /// split policies, retry, hedge, breaker, health and estimator tuning. Listen addresses,
    /// the client and the budgets' capacities keep their start-up values.
    pub fn set_config(&self, config: ProxyConfig) {
        if config.balance != self.config.load().balance {
            self.policy.store(Arc::new(balancer::build(&config.balance)));
        }
        if config.split != self.config.load().split {
            self.split.store(Arc::new(split::build(&config.split)));
        }
        self.config.store(Arc::new(config));
    }

    pub fn policy(&self) -> Arc<dyn Policy> {
        self.policy.load().as_ref().clone()
    }

    pub fn split(&self) -> Arc<dyn SplitPolicy> {
        self.split.load().as_ref().clone()
    }

    pub fn cost_model(&self) -> CostModel {
        lock(&self.cost).model()
    }

    pub fn view_params(cfg: &ProxyConfig) -> ViewParams {
        ViewParams {
            health_interval: Duration::from_millis(cfg.health.interval_ms),
            parallelism: cfg.balance.worker_parallelism,
            default_max_batch_tokens: cfg.split.default_max_batch_tokens,
        }
    }
}

impl crate::cluster::ClusterHost for AppState {
    fn config(&self) -> Arc<ProxyConfig> {
        AppState::config(self)
    }

    fn set_config(&self, config: ProxyConfig) {
        AppState::set_config(self, config)
    }

    fn pool(&self) -> &WorkerPool {
        &self.pool
    }

    fn client(&self) -> &HttpClient {
        &self.client
    }

    fn health_wake(&self) -> &Notify {
        &self.health_wake
    }

    fn observe_model(&self, model: &str, template: &str) {
        self.pair_cache.observe_model(model, template)
    }
}
