//! The Prometheus (OpenMetrics text) rendering of `/metrics`: the subtasks of this process
//! (records, bytes, time split, queues, watermarks) and the jobs whose status it holds
//! (state, restarts by cause, checkpoints, the last checkpoint per subtask), through
//! `prometheus-client`. The names and labels are documented in the README ("Metrics").

use std::sync::atomic::Ordering;
use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use cairn::metrics::{Rate, SubtaskMetrics, NO_WATERMARK};
use cairn::runtime::JobStatusView;

/// The content type of what [`render`] returns.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

type Labels = Vec<(&'static str, String)>;

/// One metric family: its samples by label set.
#[derive(Debug)]
struct Family {
    name: &'static str,
    help: &'static str,
    counter: bool,
    samples: Vec<(Labels, f64)>,
}

/// The families of one scrape, taken from the live state when it was asked for.
#[derive(Debug, Default)]
struct Scrape {
    families: Vec<Family>,
}

impl Scrape {
    fn family(&mut self, name: &'static str, help: &'static str, counter: bool) -> &mut Family {
        if let Some(i) = self.families.iter().position(|f| f.name == name) {
            return &mut self.families[i];
        }
        self.families.push(Family {
            name,
            help,
            counter,
            samples: Vec::new(),
        });
        self.families.last_mut().expect("just pushed")
    }

    fn counter(&mut self, name: &'static str, help: &'static str, labels: &Labels, v: f64) {
        self.family(name, help, true)
            .samples
            .push((labels.clone(), v));
    }

    fn gauge(&mut self, name: &'static str, help: &'static str, labels: &Labels, v: f64) {
        self.family(name, help, false)
            .samples
            .push((labels.clone(), v));
    }
}

impl Collector for Scrape {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        for f in &self.families {
            let kind = if f.counter {
                MetricType::Counter
            } else {
                MetricType::Gauge
            };
            let mut family = encoder.encode_descriptor(f.name, f.help, None, kind)?;
            for (labels, v) in &f.samples {
                let sample = family.encode_family(labels)?;
                if f.counter {
                    ConstCounter::new(*v).encode(sample)?;
                } else {
                    ConstGauge::new(*v).encode(sample)?;
                }
            }
        }
        Ok(())
    }
}

/// Renders the subtasks' and the jobs' metrics as OpenMetrics text.
pub fn render(subtasks: &[Arc<SubtaskMetrics>], jobs: &[JobStatusView], now_ms: i64) -> String {
    let mut scrape = Scrape::default();
    for m in subtasks {
        subtask(&mut scrape, m, now_ms);
    }
    for j in jobs {
        job(&mut scrape, j, now_ms);
    }
    let mut registry = Registry::default();
    registry.register_collector(Box::new(scrape));
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
    out
}

fn subtask(s: &mut Scrape, m: &SubtaskMetrics, now_ms: i64) {
    let l: Labels = vec![
        ("job_id", m.job_id.clone()),
        ("job_name", m.job_name.clone()),
        ("vertex_id", m.vertex_index.to_string()),
        ("vertex", m.vertex.clone()),
        ("subtask", m.subtask.to_string()),
    ];
    let get = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed) as f64;
    s.counter(
        "cairn_subtask_records_in",
        "Records the subtask received on its input channels and processed.",
        &l,
        get(&m.records_in),
    );
    s.counter(
        "cairn_subtask_records_out",
        "Records the subtask sent on its output channels.",
        &l,
        get(&m.records_out),
    );
    if m.is_source {
        s.counter(
            "cairn_source_records_read",
            "Records a source subtask read from its splits (replays after a restore included).",
            &l,
            get(&m.records_read),
        );
    }
    s.counter(
        "cairn_subtask_bytes_in",
        "Serialized bytes the subtask received from other processes (cluster mode).",
        &l,
        get(&m.bytes_in),
    );
    s.counter(
        "cairn_subtask_bytes_out",
        "Serialized bytes the subtask sent to other processes (cluster mode).",
        &l,
        get(&m.bytes_out),
    );
    s.gauge(
        "cairn_subtask_records_in_per_second",
        "Records in per second over the last second (sources: records read).",
        &l,
        m.rate(Rate::RecordsIn),
    );
    s.gauge(
        "cairn_subtask_records_out_per_second",
        "Records out per second over the last second.",
        &l,
        m.rate(Rate::RecordsOut),
    );
    let secs = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed) as f64 / 1e9;
    s.counter(
        "cairn_subtask_idle_seconds",
        "Time the subtask waited for input.",
        &l,
        secs(&m.idle_ns),
    );
    s.counter(
        "cairn_subtask_backpressured_seconds",
        "Time the subtask waited for credit on an output channel (back-pressured).",
        &l,
        secs(&m.backpressured_ns),
    );
    s.counter(
        "cairn_subtask_busy_seconds",
        "Time the subtask ran, neither idle nor back-pressured.",
        &l,
        secs(&m.busy_ns),
    );
    s.gauge(
        "cairn_subtask_idle_ms_per_second",
        "Milliseconds per second idle over the last second (Flink's idleTimeMsPerSecond).",
        &l,
        m.rate(Rate::IdleMsPerSecond),
    );
    s.gauge(
        "cairn_subtask_backpressured_ms_per_second",
        "Milliseconds per second back-pressured over the last second (Flink's backPressuredTimeMsPerSecond).",
        &l,
        m.rate(Rate::BackpressuredMsPerSecond),
    );
    s.gauge(
        "cairn_subtask_busy_ms_per_second",
        "Milliseconds per second busy over the last second (Flink's busyTimeMsPerSecond).",
        &l,
        m.rate(Rate::BusyMsPerSecond),
    );
    s.gauge(
        "cairn_subtask_input_queue_fill",
        "Share (0-1) of the input channels' room taken by queued batches and events.",
        &l,
        m.input_queue_fill(),
    );
    s.gauge(
        "cairn_subtask_output_queue_fill",
        "Share (0-1) of the output channels' credits taken by batches not yet received.",
        &l,
        m.output_queue_fill(),
    );
    let wm = m.watermark.load(Ordering::Relaxed);
    if wm != NO_WATERMARK {
        s.gauge(
            "cairn_subtask_watermark_milliseconds",
            "The subtask's current watermark (event time, ms since the epoch).",
            &l,
            wm as f64,
        );
        if wm < i64::MAX {
            s.gauge(
                "cairn_subtask_event_time_lag_milliseconds",
                "Processing time minus the subtask's watermark.",
                &l,
                now_ms.saturating_sub(wm) as f64,
            );
        }
    }
}

fn job(s: &mut Scrape, j: &JobStatusView, now_ms: i64) {
    let l: Labels = vec![("job_id", j.jid.clone()), ("job_name", j.name.clone())];
    let mut with_state = l.clone();
    with_state.push(("state", format!("{:?}", j.state).to_uppercase()));
    s.gauge(
        "cairn_job_info",
        "1 for every job, labelled with its current state.",
        &with_state,
        1.0,
    );
    let end = j.end_time.map_or(now_ms, |e| e as i64);
    s.gauge(
        "cairn_job_uptime_seconds",
        "Time since the job started (to its end, once it ended).",
        &l,
        end.saturating_sub(j.start_time as i64).max(0) as f64 / 1e3,
    );
    s.counter(
        "cairn_job_restarts",
        "Restarts of the job (or of some of its regions).",
        &l,
        f64::from(j.restarts),
    );
    for (cause, n) in &j.restart_causes {
        let mut lc = l.clone();
        lc.push(("cause", cause.clone()));
        s.counter(
            "cairn_job_restarts_by_cause",
            "Restarts by what caused them: task (a subtask failed), injected (--inject-failures), worker-lost, checkpoint (checkpoint failures beyond the tolerated), job (deployment).",
            &lc,
            *n as f64,
        );
    }
    let c = &j.checkpoint_counts;
    s.counter(
        "cairn_job_checkpoints_completed",
        "Checkpoints completed.",
        &l,
        c.completed as f64,
    );
    s.counter(
        "cairn_job_checkpoints_failed",
        "Checkpoints failed or aborted.",
        &l,
        c.failed as f64,
    );
    s.gauge(
        "cairn_job_checkpoints_in_progress",
        "Checkpoints in flight.",
        &l,
        c.in_progress as f64,
    );
    let Some(last) = j.checkpoint_history.last() else {
        return;
    };
    s.gauge(
        "cairn_job_last_checkpoint_id",
        "Id of the last completed checkpoint.",
        &l,
        last.checkpoint_id as f64,
    );
    s.gauge(
        "cairn_job_last_checkpoint_duration_seconds",
        "Trigger to completion of the last completed checkpoint.",
        &l,
        last.duration_ms() as f64 / 1e3,
    );
    s.gauge(
        "cairn_job_last_checkpoint_size_bytes",
        "Bytes of the last completed checkpoint's state files.",
        &l,
        last.state_size as f64,
    );
    for t in &last.tasks {
        let mut lt = l.clone();
        lt.push(("vertex", t.task.clone()));
        lt.push(("subtask", t.subtask.to_string()));
        let ms = |v: u64| v as f64 / 1e3;
        s.gauge(
            "cairn_checkpoint_subtask_alignment_seconds",
            "Last completed checkpoint, per subtask: first to last barrier of the alignment.",
            &lt,
            ms(t.alignment_ms),
        );
        s.gauge(
            "cairn_checkpoint_subtask_start_delay_seconds",
            "Last completed checkpoint, per subtask: trigger to the barrier reaching the subtask.",
            &lt,
            ms(t.start_delay_ms),
        );
        s.gauge(
            "cairn_checkpoint_subtask_sync_seconds",
            "Last completed checkpoint, per subtask: the synchronous part of the snapshot.",
            &lt,
            ms(t.sync_ms),
        );
        s.gauge(
            "cairn_checkpoint_subtask_async_seconds",
            "Last completed checkpoint, per subtask: the asynchronous part (serialization, upload).",
            &lt,
            ms(t.async_ms),
        );
        s.gauge(
            "cairn_checkpoint_subtask_state_bytes",
            "Last completed checkpoint, per subtask: bytes of its operators' state (the state size per operator chain).",
            &lt,
            t.state_size as f64,
        );
        s.gauge(
            "cairn_checkpoint_subtask_in_flight_bytes",
            "Last completed checkpoint, per subtask: bytes of in-flight data persisted (unaligned).",
            &lt,
            t.channel_state_size as f64,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_subtask_and_job_families_in_openmetrics_text() {
        let registry = cairn::metrics::MetricsRegistry::default();
        let m = registry.subtask("j1", "wordcount", 1, "count -> sink", 0, false);
        m.records_in.store(5000, Ordering::Relaxed);
        m.watermark.store(1_000, Ordering::Relaxed);
        let text = render(&[m], &[], 3_000);
        let line = |prefix: &str| {
            text.lines()
                .find(|l| l.starts_with(prefix))
                .unwrap_or_else(|| panic!("no {prefix} in {text}"))
                .to_string()
        };
        assert_eq!(
            line("cairn_subtask_records_in_total"),
            "cairn_subtask_records_in_total{job_id=\"j1\",job_name=\"wordcount\",vertex_id=\"1\",vertex=\"count -> sink\",subtask=\"0\"} 5000.0"
        );
        assert!(
            text.contains("# TYPE cairn_subtask_records_in counter"),
            "{text}"
        );
        assert!(line("cairn_subtask_event_time_lag_milliseconds").ends_with(" 2000.0"));
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}
