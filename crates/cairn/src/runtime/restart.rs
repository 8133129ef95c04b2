//! Restart strategies (R12): after a failure, whether and when the job is restored from its
//! latest completed checkpoint.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::config::RestartStrategyConfig;

/// Tracks failures against a restart strategy.
#[derive(Debug)]
pub struct RestartTracker {
    strategy: RestartStrategyConfig,
    restarts: u32,
    recent: VecDeque<Instant>,
    backoff: Option<Duration>,
    last_failure: Option<Instant>,
    rng: fastrand::Rng,
}

impl RestartTracker {
    /// A tracker for `strategy`.
    pub fn new(strategy: RestartStrategyConfig) -> Self {
        RestartTracker {
            strategy,
            restarts: 0,
            recent: VecDeque::new(),
            backoff: None,
            last_failure: None,
            rng: fastrand::Rng::with_seed(0x5eed),
        }
    }

    /// The strategy.
    pub fn strategy(&self) -> &RestartStrategyConfig {
        &self.strategy
    }

    /// The delay before a restart that is not a failure (a worker left on purpose): the
    /// strategy's current delay, with nothing counted and no backoff grown.
    pub fn delay_without_counting(&self) -> Duration {
        match self.strategy {
            RestartStrategyConfig::None => Duration::ZERO,
            RestartStrategyConfig::FixedDelay { delay, .. }
            | RestartStrategyConfig::FailureRate { delay, .. } => delay,
            RestartStrategyConfig::ExponentialDelay {
                initial_backoff,
                max_backoff,
                ..
            } => self.backoff.unwrap_or(initial_backoff).min(max_backoff),
        }
    }

    /// A failure happened at `now`: the delay before restarting, or `Err` with why the job
    /// must fail instead.
    pub fn on_failure(&mut self, now: Instant) -> Result<Duration, String> {
        let since_last = self.last_failure.map(|t| now.saturating_duration_since(t));
        self.last_failure = Some(now);
        match self.strategy {
            RestartStrategyConfig::None => Err("restart strategy is 'none'".into()),
            RestartStrategyConfig::FixedDelay { attempts, delay } => {
                if self.restarts >= attempts {
                    return Err(format!(
                        "fixed-delay restart strategy allows {attempts} restart(s)"
                    ));
                }
                self.restarts += 1;
                Ok(delay)
            }
            RestartStrategyConfig::FailureRate {
                max_failures_per_interval,
                failure_rate_interval,
                delay,
            } => {
                self.recent.push_back(now);
                while let Some(&t) = self.recent.front() {
                    if now.saturating_duration_since(t) > failure_rate_interval {
                        self.recent.pop_front();
                    } else {
                        break;
                    }
                }
                if self.recent.len() > max_failures_per_interval as usize {
                    return Err(format!(
                        "failure-rate restart strategy allows {max_failures_per_interval} failure(s) per {failure_rate_interval:?}"
                    ));
                }
                self.restarts += 1;
                Ok(delay)
            }
            RestartStrategyConfig::ExponentialDelay {
                initial_backoff,
                max_backoff,
                backoff_multiplier,
                reset_backoff_threshold,
                jitter_factor,
                attempts_before_reset_backoff,
            } => {
                if since_last.is_some_and(|d| d >= reset_backoff_threshold) {
                    self.backoff = None;
                    self.restarts = 0;
                }
                if self.restarts >= attempts_before_reset_backoff {
                    return Err(format!(
                        "exponential-delay restart strategy allows {attempts_before_reset_backoff} attempt(s) before its backoff resets"
                    ));
                }
                self.restarts += 1;
                let backoff = self.backoff.unwrap_or(initial_backoff).min(max_backoff);
                let next = backoff
                    .mul_f64(backoff_multiplier.max(1.0))
                    .min(max_backoff);
                self.backoff = Some(next);
                let jitter = backoff.mul_f64(jitter_factor.clamp(0.0, 1.0));
                let spread = jitter.as_nanos() as u64;
                let offset = if spread == 0 {
                    0
                } else {
                    self.rng.u64(0..=2 * spread)
                };
                let delayed = backoff.saturating_sub(jitter) + Duration::from_nanos(offset);
                Ok(delayed.min(max_backoff))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restart_that_is_no_failure_counts_nothing() {
        let mut t = RestartTracker::new(RestartStrategyConfig::FixedDelay {
            attempts: 1,
            delay: Duration::from_millis(5),
        });
        let now = Instant::now();
        for _ in 0..3 {
            assert_eq!(t.delay_without_counting(), Duration::from_millis(5));
        }
        assert_eq!(t.on_failure(now), Ok(Duration::from_millis(5)));
        assert!(t.on_failure(now).is_err());
    }

    #[test]
    fn fixed_delay_gives_up_after_its_attempts() {
        let mut t = RestartTracker::new(RestartStrategyConfig::FixedDelay {
            attempts: 2,
            delay: Duration::from_millis(5),
        });
        let now = Instant::now();
        assert_eq!(t.on_failure(now), Ok(Duration::from_millis(5)));
        assert_eq!(t.on_failure(now), Ok(Duration::from_millis(5)));
        assert!(t.on_failure(now).is_err());
    }

    #[test]
    fn failure_rate_counts_failures_within_the_interval() {
        let mut t = RestartTracker::new(RestartStrategyConfig::FailureRate {
            max_failures_per_interval: 2,
            failure_rate_interval: Duration::from_secs(10),
            delay: Duration::ZERO,
        });
        let t0 = Instant::now();
        assert!(t.on_failure(t0).is_ok());
        assert!(t.on_failure(t0 + Duration::from_secs(1)).is_ok());
        assert!(t.on_failure(t0 + Duration::from_secs(2)).is_err());
        let mut t = RestartTracker::new(RestartStrategyConfig::FailureRate {
            max_failures_per_interval: 1,
            failure_rate_interval: Duration::from_secs(10),
            delay: Duration::ZERO,
        });
        assert!(t.on_failure(t0).is_ok());
        assert!(t.on_failure(t0 + Duration::from_secs(11)).is_ok());
    }

    #[test]
    fn exponential_delay_grows_to_its_maximum_and_resets() {
        let mut t = RestartTracker::new(RestartStrategyConfig::ExponentialDelay {
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(350),
            backoff_multiplier: 2.0,
            reset_backoff_threshold: Duration::from_secs(60),
            jitter_factor: 0.0,
            attempts_before_reset_backoff: u32::MAX,
        });
        let t0 = Instant::now();
        let delays: Vec<_> = (0..4)
            .map(|i| t.on_failure(t0 + Duration::from_secs(i)).unwrap())
            .collect();
        assert_eq!(
            delays,
            [100, 200, 350, 350].map(Duration::from_millis).to_vec()
        );
        assert_eq!(
            t.on_failure(t0 + Duration::from_secs(100)).unwrap(),
            Duration::from_millis(100)
        );
    }

    #[test]
    fn none_never_restarts() {
        assert!(RestartTracker::new(RestartStrategyConfig::None)
            .on_failure(Instant::now())
            .is_err());
    }
}
