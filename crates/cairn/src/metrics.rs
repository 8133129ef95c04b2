//! Metrics of the subtasks running in this process, and their Prometheus rendering.
//!
//! Counting costs no per-record synchronisation: a task thread adds to its own subtask's
//! atomics once per batch (records, bytes) and once per blocking wait (idle and back-pressured
//! time, measured only when a wait really blocks); gauges (queue fill, watermark) are read when
//! someone looks. The subtask a thread works for is a thread-local set when the task starts
//! ([`enter`]), so the channel code counts without knowing whose it is. A meter thread turns
//! the counters into per-second rates once a second, as Flink's meters do. `metrics.enabled:
//! false` registers nothing: the hot path then only finds an empty thread-local.
//!
//! The registry is process-wide ([`registry`]): an embedded `cairn run` holds its job's
//! subtasks, a worker the subtasks deployed on it; a coordinator holds none, only what its
//! workers report ([`remote`]). `cairn-rest` renders all of it (`/metrics`, the vertex
//! endpoints). Below the runtime: it knows no task, channel or job, only counters.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Something whose room can be measured: an output channel's credits.
pub trait Queue: Send + Sync + std::fmt::Debug {
    /// Units in use and the room there is.
    fn in_use(&self) -> (usize, usize);
}

/// No watermark yet.
pub const NO_WATERMARK: i64 = i64::MIN;

/// How often the meter thread turns counters into rates.
const METER_INTERVAL: Duration = Duration::from_secs(1);
/// How long the metrics of a subtask that stopped running stay reported (a worker's ended
/// jobs are forgotten after it).
const RETAIN_STOPPED: Duration = Duration::from_secs(600);

/// The counters and gauges of one subtask (of a job vertex), kept across its attempts so
/// that counters only grow.
#[derive(Debug)]
pub struct SubtaskMetrics {
    /// Job id.
    pub job_id: String,
    /// Job name.
    pub job_name: String,
    /// Index of the vertex (operator chain) in the job's plan.
    pub vertex_index: usize,
    /// The vertex's name (its operators' names).
    pub vertex: String,
    /// Subtask index.
    pub subtask: u32,
    /// Whether the vertex is a source.
    pub is_source: bool,
    /// Records that arrived on input channels and were processed.
    pub records_in: AtomicU64,
    /// Records sent on output channels.
    pub records_out: AtomicU64,
    /// Records a source read (sources only).
    pub records_read: AtomicU64,
    /// Serialized bytes received from other processes.
    pub bytes_in: AtomicU64,
    /// Serialized bytes sent to other processes.
    pub bytes_out: AtomicU64,
    /// Nanoseconds spent waiting for input (or, for a source, for data or the next mail).
    pub idle_ns: AtomicU64,
    /// Nanoseconds spent waiting for credit on an output channel (back-pressured).
    pub backpressured_ns: AtomicU64,
    /// Nanoseconds neither idle nor back-pressured while running (kept by the meter).
    pub busy_ns: AtomicU64,
    /// Task threads of this subtask running now (0 or 1; briefly 2 across a restart).
    running: AtomicU32,
    /// When the last task thread of the subtask stopped, if none runs.
    stopped_at: Mutex<Option<Instant>>,
    /// Whether its last attempt reached the end of its input (FINISHED): it runs no more.
    finished: AtomicBool,
    /// Mails (batches and events) queued in the input mailbox when the task last took one.
    pub inputs_queued: AtomicU64,
    /// Batches the current attempt's input channels may hold in all.
    pub input_room: AtomicU64,
    /// Credits of the current attempt's output channels (for the output queue's fill).
    outputs: Mutex<Vec<Arc<dyn Queue>>>,
    /// The subtask's current watermark ([`NO_WATERMARK`] before the first).
    pub watermark: AtomicI64,
    /// Per-second rates from the meter: records in, records out (sources: read), and
    /// milliseconds per second idle, back-pressured and busy (f64 bits).
    rates: [AtomicU64; 5],
    meter: Mutex<MeterState>,
}

#[derive(Debug, Default)]
struct MeterState {
    records_in: u64,
    records_out: u64,
    idle_ns: u64,
    backpressured_ns: u64,
}

/// A subtask's metrics at one moment, as REST answers and a worker reports them to its
/// coordinator.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SubtaskSnapshot {
    /// Job id.
    pub job_id: String,
    /// Vertex index in the job's plan.
    pub vertex_index: u32,
    /// Subtask index.
    pub subtask: u32,
    /// Whether a task thread of it runs.
    pub running: bool,
    /// Records in (sources: records read).
    pub records_in: u64,
    /// Records out.
    pub records_out: u64,
    /// Serialized bytes in and out.
    pub bytes_in: u64,
    /// Serialized bytes out.
    pub bytes_out: u64,
    /// Accumulated idle, back-pressured and busy time (ms).
    pub idle_ms: u64,
    /// Accumulated back-pressured time (ms).
    pub backpressured_ms: u64,
    /// Accumulated busy time (ms).
    pub busy_ms: u64,
    /// Records in and out per second; idle, back-pressured and busy ms per second.
    pub rates: [f64; 5],
    /// Input and output queue fill (0..=1).
    pub queues: [f64; 2],
    /// Watermark ([`NO_WATERMARK`] before the first).
    pub watermark: i64,
    /// The worker that reported it, in a coordinator: its id and data address. Not sent: the
    /// coordinator sets it from the connection the report came on (None in the process that
    /// runs the subtask).
    #[serde(skip)]
    pub worker: Option<(u32, String)>,
}

/// Which per-second rate of [`SubtaskMetrics::rate`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rate {
    /// Records in per second (sources: records read).
    RecordsIn = 0,
    /// Records out per second.
    RecordsOut = 1,
    /// Milliseconds per second waiting for input.
    IdleMsPerSecond = 2,
    /// Milliseconds per second waiting for output credit.
    BackpressuredMsPerSecond = 3,
    /// Milliseconds per second working.
    BusyMsPerSecond = 4,
}

impl SubtaskMetrics {
    fn new(
        job_id: &str,
        job_name: &str,
        vertex_index: usize,
        vertex: &str,
        subtask: u32,
        is_source: bool,
    ) -> Self {
        SubtaskMetrics {
            job_id: job_id.to_string(),
            job_name: job_name.to_string(),
            vertex_index,
            vertex: vertex.to_string(),
            subtask,
            is_source,
            records_in: AtomicU64::new(0),
            records_out: AtomicU64::new(0),
            records_read: AtomicU64::new(0),
            bytes_in: AtomicU64::new(0),
            bytes_out: AtomicU64::new(0),
            idle_ns: AtomicU64::new(0),
            backpressured_ns: AtomicU64::new(0),
            busy_ns: AtomicU64::new(0),
            running: AtomicU32::new(0),
            stopped_at: Mutex::new(None),
            finished: AtomicBool::new(false),
            inputs_queued: AtomicU64::new(0),
            input_room: AtomicU64::new(0),
            outputs: Mutex::new(Vec::new()),
            watermark: AtomicI64::new(NO_WATERMARK),
            rates: Default::default(),
            meter: Mutex::new(MeterState::default()),
        }
    }

    /// The metrics now.
    pub fn snapshot(&self) -> SubtaskSnapshot {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        SubtaskSnapshot {
            job_id: self.job_id.clone(),
            vertex_index: self.vertex_index as u32,
            subtask: self.subtask,
            running: self.is_running(),
            records_in: if self.is_source {
                get(&self.records_read)
            } else {
                get(&self.records_in)
            },
            records_out: get(&self.records_out),
            bytes_in: get(&self.bytes_in),
            bytes_out: get(&self.bytes_out),
            idle_ms: get(&self.idle_ns) / 1_000_000,
            backpressured_ms: get(&self.backpressured_ns) / 1_000_000,
            busy_ms: get(&self.busy_ns) / 1_000_000,
            rates: [
                self.rate(Rate::RecordsIn),
                self.rate(Rate::RecordsOut),
                self.rate(Rate::IdleMsPerSecond),
                self.rate(Rate::BackpressuredMsPerSecond),
                self.rate(Rate::BusyMsPerSecond),
            ],
            queues: [self.input_queue_fill(), self.output_queue_fill()],
            watermark: self.watermark.load(Ordering::Relaxed),
            worker: None,
        }
    }

    /// A per-second rate over the last meter interval.
    pub fn rate(&self, which: Rate) -> f64 {
        f64::from_bits(self.rates[which as usize].load(Ordering::Relaxed))
    }

    /// Whether a task thread of the subtask runs now.
    pub fn is_running(&self) -> bool {
        self.running.load(Ordering::Relaxed) > 0
    }

    /// The share of the input queue's room in use (0..=1): queued mails over the channels'
    /// credits.
    pub fn input_queue_fill(&self) -> f64 {
        let room = self.input_room.load(Ordering::Relaxed);
        if room == 0 {
            return 0.0;
        }
        (self.inputs_queued.load(Ordering::Relaxed) as f64 / room as f64).min(1.0)
    }

    /// The share of the output channels' credits in use (0..=1): batches sent and not yet
    /// taken by the receivers.
    pub fn output_queue_fill(&self) -> f64 {
        let outputs = self.outputs.lock().map(|o| o.clone()).unwrap_or_default();
        let (used, room) = outputs.iter().fold((0, 0), |(u, r), c| {
            let (cu, cr) = c.in_use();
            (u + cu, r + cr)
        });
        if room == 0 {
            0.0
        } else {
            (used as f64 / room as f64).min(1.0)
        }
    }

    /// A new attempt of the subtask: the batches its input channels may hold, its output
    /// channels.
    pub fn attach(&self, input_room: usize, outputs: Vec<Arc<dyn Queue>>) {
        self.input_room.store(input_room as u64, Ordering::Relaxed);
        self.inputs_queued.store(0, Ordering::Relaxed);
        if let Ok(mut o) = self.outputs.lock() {
            *o = outputs;
        }
    }

    fn tick(&self, dt: Duration) {
        let Ok(mut last) = self.meter.lock() else {
            return;
        };
        let secs = dt.as_secs_f64().max(1e-3);
        let records_in = if self.is_source {
            self.records_read.load(Ordering::Relaxed)
        } else {
            self.records_in.load(Ordering::Relaxed)
        };
        let records_out = self.records_out.load(Ordering::Relaxed);
        let idle = self.idle_ns.load(Ordering::Relaxed);
        let bp = self.backpressured_ns.load(Ordering::Relaxed);
        let d_in = records_in.saturating_sub(last.records_in);
        let d_out = records_out.saturating_sub(last.records_out);
        let d_idle = idle.saturating_sub(last.idle_ns);
        let d_bp = bp.saturating_sub(last.backpressured_ns);
        let alive = if self.is_running() {
            dt.as_nanos() as u64
        } else {
            0
        };
        // Waits are counted when they end: a long one lands in one interval; clamp.
        let (d_idle, d_bp) = (d_idle.min(alive), d_bp.min(alive));
        let busy = alive.saturating_sub(d_idle + d_bp);
        self.busy_ns.fetch_add(busy, Ordering::Relaxed);
        let per_s = |v: u64| v as f64 / secs;
        let ms_per_s = |ns: u64| ns as f64 / 1e6 / secs;
        let values = [
            per_s(d_in),
            per_s(d_out),
            ms_per_s(d_idle),
            ms_per_s(d_bp),
            ms_per_s(busy),
        ];
        for (slot, v) in self.rates.iter().zip(values) {
            slot.store(v.to_bits(), Ordering::Relaxed);
        }
        *last = MeterState {
            records_in,
            records_out,
            idle_ns: idle,
            backpressured_ns: bp,
        };
    }
}

/// The subtasks of every job in this process.
#[derive(Debug, Default)]
pub struct MetricsRegistry {
    subtasks: Mutex<Vec<Arc<SubtaskMetrics>>>,
    meter: OnceLock<()>,
}

/// This process's registry.
pub fn registry() -> &'static MetricsRegistry {
    static REGISTRY: OnceLock<MetricsRegistry> = OnceLock::new();
    REGISTRY.get_or_init(MetricsRegistry::default)
}

impl MetricsRegistry {
    /// The metrics of a subtask, created on its first attempt and kept for the next ones.
    pub fn subtask(
        &self,
        job_id: &str,
        job_name: &str,
        vertex_index: usize,
        vertex: &str,
        subtask: u32,
        is_source: bool,
    ) -> Arc<SubtaskMetrics> {
        self.start_meter();
        let Ok(mut all) = self.subtasks.lock() else {
            return Arc::new(SubtaskMetrics::new(
                job_id,
                job_name,
                vertex_index,
                vertex,
                subtask,
                is_source,
            ));
        };
        if let Some(m) = all.iter().find(|m| {
            m.job_id == job_id
                && m.vertex_index == vertex_index
                && m.subtask == subtask
                && m.vertex == vertex
        }) {
            return m.clone();
        }
        let m = Arc::new(SubtaskMetrics::new(
            job_id,
            job_name,
            vertex_index,
            vertex,
            subtask,
            is_source,
        ));
        all.push(m.clone());
        m
    }

    /// Every subtask's metrics, by job, vertex and subtask.
    pub fn subtasks(&self) -> Vec<Arc<SubtaskMetrics>> {
        let mut all = self.subtasks.lock().map(|s| s.clone()).unwrap_or_default();
        all.sort_by(|a, b| {
            (&a.job_id, a.vertex_index, a.subtask).cmp(&(&b.job_id, b.vertex_index, b.subtask))
        });
        all
    }

    /// The subtasks of job `job_id`.
    pub fn of_job(&self, job_id: &str) -> Vec<Arc<SubtaskMetrics>> {
        let mut all = self.subtasks();
        all.retain(|m| m.job_id == job_id);
        all
    }

    /// Forgets a job that ended (its subtasks' metrics stop being reported).
    pub fn retire_job(&self, job_id: &str) {
        if let Ok(mut all) = self.subtasks.lock() {
            all.retain(|m| m.job_id != job_id);
        }
    }

    /// Forgets job `job_id` if every one of its subtasks here finished (a job's last
    /// subtask to finish ends the job in this process: its series, a watermark at
    /// `i64::MAX` say, would otherwise be scraped for [`RETAIN_STOPPED`]).
    fn retire_if_finished(&self, job_id: &str) {
        if let Ok(mut all) = self.subtasks.lock() {
            let done =
                |m: &Arc<SubtaskMetrics>| m.finished.load(Ordering::Relaxed) && !m.is_running();
            if all.iter().filter(|m| m.job_id == job_id).all(done) {
                all.retain(|m| m.job_id != job_id);
            }
        }
    }

    /// Forgets the subtasks that stopped running longer than `retain` ago.
    fn forget_stopped(&self, retain: Duration) {
        let expired = |m: &Arc<SubtaskMetrics>| {
            !m.is_running()
                && m.stopped_at
                    .lock()
                    .ok()
                    .and_then(|s| *s)
                    .is_some_and(|t| t.elapsed() > retain)
        };
        if let Ok(mut all) = self.subtasks.lock() {
            all.retain(|m| !expired(m));
        }
    }

    fn start_meter(&self) {
        self.meter.get_or_init(|| {
            let _ = std::thread::Builder::new()
                .name("metrics-meter".into())
                .spawn(|| {
                    let mut last = Instant::now();
                    loop {
                        std::thread::sleep(METER_INTERVAL);
                        let now = Instant::now();
                        for m in registry().subtasks() {
                            m.tick(now - last);
                        }
                        registry().forget_stopped(RETAIN_STOPPED);
                        last = now;
                    }
                });
        });
    }
}

/// Snapshots of subtasks running in other processes (a coordinator's jobs' subtasks, as
/// their workers report them), newest report per subtask.
#[derive(Debug, Default)]
pub struct RemoteSubtasks {
    reports: Mutex<std::collections::BTreeMap<SubtaskKey, (SubtaskSnapshot, Instant)>>,
}

/// A subtask of a job: job id, vertex index, subtask index.
type SubtaskKey = (String, u32, u32);

/// This process's store of reported subtask snapshots.
pub fn remote() -> &'static RemoteSubtasks {
    static REMOTE: OnceLock<RemoteSubtasks> = OnceLock::new();
    REMOTE.get_or_init(RemoteSubtasks::default)
}

impl RemoteSubtasks {
    /// Takes the report of worker `worker` (its id and data address): every subtask its
    /// registry holds, so a subtask of it missing from the report (of a job the worker
    /// forgot) is forgotten here too.
    pub fn report(&self, worker: (u32, &str), snapshots: Vec<SubtaskSnapshot>) {
        let Ok(mut r) = self.reports.lock() else {
            return;
        };
        let now = Instant::now();
        r.retain(|key, (s, _)| {
            s.worker.as_ref().map(|w| w.0) != Some(worker.0)
                || snapshots
                    .iter()
                    .any(|n| (&n.job_id, n.vertex_index, n.subtask) == (&key.0, key.1, key.2))
        });
        for mut s in snapshots {
            s.worker = Some((worker.0, worker.1.to_string()));
            r.insert((s.job_id.clone(), s.vertex_index, s.subtask), (s, now));
        }
        r.retain(|_, (_, at)| now.duration_since(*at) < RETAIN_STOPPED);
    }

    /// Forgets the reports of job `job_id`'s subtasks.
    pub fn forget_job(&self, job_id: &str) {
        if let Ok(mut r) = self.reports.lock() {
            r.retain(|(job, _, _), _| job != job_id);
        }
    }

    fn of_job(&self, job_id: &str) -> Vec<SubtaskSnapshot> {
        self.reports
            .lock()
            .map(|r| {
                r.values()
                    .filter(|(s, _)| s.job_id == job_id)
                    .map(|(s, _)| s.clone())
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// Forgets job `job_id` in this process: its subtasks' metrics ([`registry`]) and the
/// reports of them ([`remote`]). For the end of a job the runtime does not see end here: a
/// cancelled or failed job on a worker, a job that ended at a coordinator. (A job whose
/// subtasks all finished is forgotten as the last one ends.)
pub fn forget_job(job_id: &str) {
    registry().retire_job(job_id);
    remote().forget_job(job_id);
}

/// The subtasks of job `job_id`, here or reported by workers, by vertex and subtask.
pub fn snapshots_of_job(job_id: &str) -> Vec<SubtaskSnapshot> {
    let mut all: Vec<SubtaskSnapshot> = registry()
        .of_job(job_id)
        .iter()
        .map(|m| m.snapshot())
        .collect();
    for s in remote().of_job(job_id) {
        if !all
            .iter()
            .any(|a| (a.vertex_index, a.subtask) == (s.vertex_index, s.subtask))
        {
            all.push(s);
        }
    }
    all.sort_by_key(|s| (s.vertex_index, s.subtask));
    all
}

thread_local! {
    static CURRENT: RefCell<Option<Arc<SubtaskMetrics>>> = const { RefCell::new(None) };
}

/// The task thread works for `metrics` until the guard drops.
pub fn enter(metrics: Option<Arc<SubtaskMetrics>>) -> TaskGuard {
    if let Some(m) = &metrics {
        m.running.fetch_add(1, Ordering::Relaxed);
        m.finished.store(false, Ordering::Relaxed);
        if let Ok(mut s) = m.stopped_at.lock() {
            *s = None;
        }
    }
    CURRENT.with(|c| *c.borrow_mut() = metrics.clone());
    TaskGuard(metrics)
}

/// Ends a task thread's [`enter`].
pub struct TaskGuard(Option<Arc<SubtaskMetrics>>);

impl TaskGuard {
    /// The subtask reached the end of its input: once every subtask of its job here has, the
    /// job's metrics are forgotten (when the last guard drops).
    pub fn finished(&self) {
        if let Some(m) = &self.0 {
            m.finished.store(true, Ordering::Relaxed);
        }
    }
}

impl Drop for TaskGuard {
    fn drop(&mut self) {
        if let Some(m) = &self.0 {
            if m.running.fetch_sub(1, Ordering::Relaxed) == 1 {
                if let Ok(mut s) = m.stopped_at.lock() {
                    *s = Some(Instant::now());
                }
                if m.finished.load(Ordering::Relaxed) {
                    registry().retire_if_finished(&m.job_id);
                }
            }
        }
        CURRENT.with(|c| *c.borrow_mut() = None);
    }
}

/// Runs `f` on the current thread's subtask metrics, if any.
#[inline]
pub(crate) fn with_current(f: impl FnOnce(&SubtaskMetrics)) {
    CURRENT.with(|c| {
        if let Some(m) = c.borrow().as_deref() {
            f(m);
        }
    });
}

/// A batch of `records` left on an output channel (`bytes` serialized, 0 in process).
#[inline]
pub(crate) fn sent(records: usize, bytes: usize) {
    with_current(|m| {
        m.records_out.fetch_add(records as u64, Ordering::Relaxed);
        if bytes > 0 {
            m.bytes_out.fetch_add(bytes as u64, Ordering::Relaxed);
        }
    });
}

/// The thread waited `waited` for output credit.
pub(crate) fn backpressured(waited: Duration) {
    with_current(|m| {
        m.backpressured_ns
            .fetch_add(waited.as_nanos() as u64, Ordering::Relaxed);
    });
}

/// The thread waited `waited` for input.
pub(crate) fn idle(waited: Duration) {
    with_current(|m| {
        m.idle_ns
            .fetch_add(waited.as_nanos() as u64, Ordering::Relaxed);
    });
}

/// The subtask's watermark advanced to `watermark`.
pub(crate) fn watermark(watermark: i64) {
    with_current(|m| m.watermark.store(watermark, Ordering::Relaxed));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_go_to_the_thread_s_subtask_and_rates_follow() {
        let r = MetricsRegistry::default();
        let m = r.subtask("job-a", "wc", 1, "count", 0, false);
        assert!(Arc::ptr_eq(
            &m,
            &r.subtask("job-a", "wc", 1, "count", 0, false)
        ));
        let other = r.subtask("job-a", "wc", 1, "count", 1, false);
        {
            let _g = enter(Some(m.clone()));
            sent(1000, 0);
            sent(24, 10);
            backpressured(Duration::from_millis(300));
            idle(Duration::from_millis(200));
            m.records_in.fetch_add(500, Ordering::Relaxed);
            watermark(42);
            assert!(m.is_running());
            m.tick(Duration::from_secs(1));
        }
        assert!(!m.is_running());
        // Outside a task, counting goes nowhere.
        sent(7, 0);
        assert_eq!(m.records_out.load(Ordering::Relaxed), 1024);
        assert_eq!(m.bytes_out.load(Ordering::Relaxed), 10);
        assert_eq!(other.records_out.load(Ordering::Relaxed), 0);
        assert_eq!(m.watermark.load(Ordering::Relaxed), 42);
        assert_eq!(m.rate(Rate::RecordsOut), 1024.0);
        assert_eq!(m.rate(Rate::RecordsIn), 500.0);
        assert!((m.rate(Rate::BackpressuredMsPerSecond) - 300.0).abs() < 1e-6);
        assert!((m.rate(Rate::IdleMsPerSecond) - 200.0).abs() < 1e-6);
        assert!((m.rate(Rate::BusyMsPerSecond) - 500.0).abs() < 1e-6);
        // Not running: no busy time.
        m.tick(Duration::from_secs(1));
        assert_eq!(m.rate(Rate::BusyMsPerSecond), 0.0);
        assert_eq!(m.rate(Rate::RecordsOut), 0.0);
        r.retire_job("job-a");
        assert!(r.subtasks().is_empty());
    }

    #[derive(Debug)]
    struct Fixed(usize, usize);

    impl Queue for Fixed {
        fn in_use(&self) -> (usize, usize) {
            (self.0, self.1)
        }
    }

    #[test]
    fn queue_fill_is_the_share_of_room_in_use() {
        let m = SubtaskMetrics::new("j", "n", 0, "v", 0, false);
        assert_eq!((m.input_queue_fill(), m.output_queue_fill()), (0.0, 0.0));
        m.attach(16, vec![Arc::new(Fixed(3, 4)), Arc::new(Fixed(1, 4))]);
        assert_eq!(m.output_queue_fill(), 0.5);
        m.inputs_queued.store(4, Ordering::Relaxed);
        assert_eq!(m.input_queue_fill(), 0.25);
        m.inputs_queued.store(40, Ordering::Relaxed);
        assert_eq!(m.input_queue_fill(), 1.0);
    }
}
