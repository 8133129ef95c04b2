//! Leadership among coordinators that share a checkpoint directory: one leads, the others
//! stand by and take over when its lease lapses.
//!
//! The contest needs nothing but the shared storage (no ZooKeeper, etcd or Kubernetes API).
//! Under `<checkpoint-dir>/_leader/`:
//! - `epoch-<n>`: the claim of epoch n (JSON [`Claim`]: who, where, with which lease). It is
//!   made by a conditional create — a complete temporary file hard-linked to the name, which
//!   fails if the name exists — so of two coordinators claiming epoch n exactly one wins, and
//!   a reader never sees half a claim. It is never changed after.
//! - `epoch-<n>.renewal`: the leader's renewals ([`Renewal`]: a counter, rewritten atomically
//!   every quarter lease; `released` when the leader stepped down on purpose).
//!
//! The rules (the decisions are the pure [`Standby`] and [`Lease`], which tests drive):
//! - The leader of epoch n may change shared state until its *deadline*: the instant it began
//!   its last successful renewal (or its claim), plus the lease. Every fenced write asks
//!   ([`Leadership`] is the storage's [`Fence`]) and is refused after the deadline or once an
//!   epoch above n exists; a write that completes something asks again after it landed.
//! - A standby claims epoch n+1 only after it watched epoch n's renewal stay the same for the
//!   lease and a margin on its own clock. Its watch began after the renewal was written, so
//!   the claim comes after the old leader's deadline: by then the old leader refuses its own
//!   writes, even one that was paused (GC, SIGSTOP) and resumes later.
//! - A standby takes over at once when the leader released the lease, or when the claim names
//!   a process on this host that no longer exists (a SIGKILLed coordinator restarted in place
//!   does not wait out its predecessor's lease).
//! - A leader that misses its deadline (a stalled disk, a pause) or sees a newer epoch has lost
//!   leadership; its owner suspends its jobs (nothing recorded) and stops.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tracing::{error, info, warn};

use crate::storage::Fence;

/// The directory of the leadership contest under the checkpoint directory.
pub const LEADER_DIR: &str = "_leader";

/// A coordinator's claim of an epoch: `_leader/epoch-<n>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claim {
    /// The epoch claimed.
    pub epoch: u64,
    /// The address workers connect to, as configured.
    pub bind: String,
    /// The REST API's address, as configured.
    pub rest: String,
    /// The lease the claimant keeps (ms): it renews within it, or its leadership lapses.
    pub lease_ms: u64,
    /// The claimant's host (its name, boot id and pid namespace; empty where unknown) and
    /// process id, so that a coordinator on the same host can tell the claimant is gone.
    pub host: String,
    /// The claimant's process id.
    pub pid: u32,
}

/// The leader's renewals of its epoch: `_leader/epoch-<n>.renewal`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Renewal {
    /// How many renewals so far.
    pub count: u64,
    /// The leader stepped down: a standby may claim the next epoch at once.
    #[serde(default)]
    pub released: bool,
}

/// What a standby sees of the current epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    /// The highest claim.
    pub claim: Claim,
    /// Its latest renewal (None: none written yet).
    pub renewal: Option<Renewal>,
    /// The claimant is known to be gone (a process of this host that no longer exists).
    pub holder_gone: bool,
}

/// A standby's decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Claim this epoch now.
    Claim(u64),
    /// Someone leads; look again later.
    Wait,
}

/// A standby's watch of the current epoch (sans I/O: time and observations are arguments).
#[derive(Debug, Default)]
pub struct Standby {
    /// The epoch and renewal last seen to change, and when.
    seen: Option<(u64, Option<Renewal>, Instant)>,
}

impl Standby {
    /// What to do, given what the storage shows at `now` (`None`: no epoch was ever claimed).
    pub fn observe(&mut self, now: Instant, current: Option<&Observed>) -> Verdict {
        let Some(o) = current else {
            return Verdict::Claim(1);
        };
        let next = o.claim.epoch + 1;
        if o.holder_gone || o.renewal.is_some_and(|r| r.released) {
            return Verdict::Claim(next);
        }
        match self.seen {
            Some((epoch, renewal, since)) if epoch == o.claim.epoch && renewal == o.renewal => {
                if now.duration_since(since) >= lapse(Duration::from_millis(o.claim.lease_ms)) {
                    Verdict::Claim(next)
                } else {
                    Verdict::Wait
                }
            }
            _ => {
                self.seen = Some((o.claim.epoch, o.renewal, now));
                Verdict::Wait
            }
        }
    }
}

/// How long a standby must see a lease unrenewed before it claims the next epoch: the lease
/// and a margin for clocks that run at slightly different rates.
pub fn lapse(lease: Duration) -> Duration {
    lease + lease / 10 + Duration::from_millis(50)
}

/// A leader's hold on its epoch (sans I/O).
#[derive(Debug)]
pub struct Lease {
    lease: Duration,
    deadline: Instant,
    lost: Option<String>,
}

impl Lease {
    /// A lease of length `lease`, claimed (or last renewed) by a write that began at `began`.
    pub fn new(lease: Duration, began: Instant) -> Lease {
        Lease {
            lease,
            deadline: began + lease,
            lost: None,
        }
    }

    /// A renewal that began at `began` was written.
    pub fn renewed(&mut self, began: Instant) {
        if self.lost.is_none() {
            self.deadline = self.deadline.max(began + self.lease);
        }
    }

    /// Leadership is lost for good (a newer epoch, a release).
    pub fn lose(&mut self, why: String) {
        self.lost.get_or_insert(why);
    }

    /// Ok while the holder may change shared state at `now`.
    pub fn check(&self, now: Instant) -> Result<(), String> {
        if let Some(why) = &self.lost {
            return Err(why.clone());
        }
        if now >= self.deadline {
            return Err(format!(
                "its lease of {} ms lapsed {} ms ago without a renewal",
                self.lease.as_millis(),
                now.duration_since(self.deadline).as_millis()
            ));
        }
        Ok(())
    }
}

/// The leadership files of a checkpoint directory.
#[derive(Debug, Clone)]
struct Store {
    dir: PathBuf,
}

impl Store {
    fn claim_path(&self, epoch: u64) -> PathBuf {
        self.dir.join(format!("epoch-{epoch}"))
    }

    fn renewal_path(&self, epoch: u64) -> PathBuf {
        self.dir.join(format!("epoch-{epoch}.renewal"))
    }

    /// The highest epoch claimed, if any.
    fn highest(&self) -> Result<Option<u64>, String> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("cannot list {}: {e}", self.dir.display())),
        };
        Ok(entries
            .flatten()
            .filter_map(|e| {
                let name = e.file_name();
                name.to_str()?.strip_prefix("epoch-")?.parse::<u64>().ok()
            })
            .max())
    }

    fn read_claim(&self, epoch: u64) -> Result<Claim, String> {
        let path = self.claim_path(epoch);
        let bytes =
            std::fs::read(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        serde_json::from_slice(&bytes)
            .map_err(|e| format!("damaged leader claim {}: {e}", path.display()))
    }

    fn read_renewal(&self, epoch: u64) -> Result<Option<Renewal>, String> {
        let path = self.renewal_path(epoch);
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| format!("damaged lease renewal {}: {e}", path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(format!("cannot read {}: {e}", path.display())),
        }
    }

    /// Claims `claim.epoch`: Ok(false) if another coordinator has it.
    fn claim(&self, claim: &Claim) -> Result<bool, String> {
        std::fs::create_dir_all(&self.dir)
            .map_err(|e| format!("cannot create {}: {e}", self.dir.display()))?;
        let tmp = self.dir.join(format!(
            ".claim-{}-{:016x}.tmp",
            claim.epoch,
            fastrand::u64(..)
        ));
        let bytes = serde_json::to_vec(claim).map_err(|e| e.to_string())?;
        write_synced(&tmp, &bytes)?;
        let target = self.claim_path(claim.epoch);
        let linked = std::fs::hard_link(&tmp, &target);
        let _ = std::fs::remove_file(&tmp);
        match linked {
            Ok(()) => {
                sync_dir(&self.dir);
                Ok(true)
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(format!("cannot claim {}: {e}", target.display())),
        }
    }

    fn write_renewal(&self, epoch: u64, renewal: Renewal) -> Result<(), String> {
        let path = self.renewal_path(epoch);
        let tmp = self
            .dir
            .join(format!(".renewal-{epoch}-{:016x}.tmp", fastrand::u64(..)));
        let bytes = serde_json::to_vec(&renewal).map_err(|e| e.to_string())?;
        write_synced(&tmp, &bytes)?;
        std::fs::rename(&tmp, &path)
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        Ok(())
    }

    /// What a standby sees: the highest claim, its renewal, whether its holder is gone.
    fn observe(&self, host: &str) -> Result<Option<Observed>, String> {
        let Some(epoch) = self.highest()? else {
            return Ok(None);
        };
        let claim = self.read_claim(epoch)?;
        let renewal = self.read_renewal(epoch)?;
        let holder_gone = !host.is_empty() && claim.host == host && !process_exists(claim.pid);
        Ok(Some(Observed {
            claim,
            renewal,
            holder_gone,
        }))
    }
}

fn write_synced(path: &Path, bytes: &[u8]) -> Result<(), String> {
    use std::io::Write;
    let mut f =
        std::fs::File::create(path).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

fn sync_dir(dir: &Path) {
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
}

/// This host's identity as far as process ids go: its name, boot id and process-id namespace
/// (two containers sharing a host name still have their own pid namespaces, where the same
/// pid names different processes). Empty where unknown, which turns the same-host shortcut off.
fn host_identity() -> String {
    let read = |p: &str| std::fs::read_to_string(p).map(|s| s.trim().to_string());
    let pid_ns = std::fs::read_link("/proc/self/ns/pid").map(|l| l.display().to_string());
    match (
        read("/proc/sys/kernel/hostname"),
        read("/proc/sys/kernel/random/boot_id"),
        pid_ns,
    ) {
        (Ok(name), Ok(boot), Ok(ns)) if !name.is_empty() && !boot.is_empty() => {
            format!("{name}/{boot}/{ns}")
        }
        _ => String::new(),
    }
}

/// Whether process `pid` of this host exists (a zombie does: it is not yet known gone).
fn process_exists(pid: u32) -> bool {
    pid != std::process::id() && Path::new(&format!("/proc/{pid}")).exists()
}

/// How a coordinator takes part in the contest.
#[derive(Debug, Clone)]
pub struct Candidate {
    /// The checkpoint directory the coordinators share.
    pub checkpoint_dir: PathBuf,
    /// Its worker address and REST address, as configured (recorded in its claim).
    pub bind: String,
    /// REST address.
    pub rest: String,
    /// The lease it keeps once it leads.
    pub lease: Duration,
    /// Take over at once from a leader that was a process of this host and no longer exists
    /// (off: always wait out the lease, as a coordinator on another host must).
    pub same_host_takeover: bool,
}

/// This coordinator's leadership of one epoch: the [`Fence`] of everything it writes.
#[derive(Debug)]
pub struct Leadership {
    store: Store,
    claim: Claim,
    lease: Mutex<Lease>,
    renewals: Mutex<u64>,
}

impl Leadership {
    /// Waits until `candidate` leads (claiming the first epoch, or the next one when the
    /// current leader's lease lapses, it released it, or it is gone), and returns its
    /// leadership. `waiting` is told, once per epoch, who leads meanwhile.
    pub fn acquire(
        candidate: &Candidate,
        mut waiting: impl FnMut(&Claim),
    ) -> Result<Arc<Leadership>, String> {
        if candidate.lease.is_zero() {
            return Err("the leader lease must be longer than 0".into());
        }
        let store = Store {
            dir: candidate.checkpoint_dir.join(LEADER_DIR),
        };
        let host = if candidate.same_host_takeover {
            host_identity()
        } else {
            String::new()
        };
        let poll =
            (candidate.lease / 20).clamp(Duration::from_millis(10), Duration::from_millis(250));
        let mut standby = Standby::default();
        let mut told: Option<u64> = None;
        let mut last_problem: Option<String> = None;
        loop {
            let now = Instant::now();
            let observed = match store.observe(&host) {
                Ok(o) => o,
                Err(problem) => {
                    // A claim half-visible on a remote filesystem, a damaged file: look again,
                    // and never claim over what cannot be read.
                    if last_problem.as_ref() != Some(&problem) {
                        warn!("leadership: {problem}; looking again");
                        last_problem = Some(problem);
                    }
                    std::thread::sleep(poll);
                    continue;
                }
            };
            match standby.observe(now, observed.as_ref()) {
                Verdict::Wait => {
                    if let Some(o) = &observed {
                        if told != Some(o.claim.epoch) {
                            waiting(&o.claim);
                            told = Some(o.claim.epoch);
                        }
                    }
                    std::thread::sleep(poll);
                }
                Verdict::Claim(epoch) => {
                    let claim = Claim {
                        epoch,
                        bind: candidate.bind.clone(),
                        rest: candidate.rest.clone(),
                        lease_ms: u64::try_from(candidate.lease.as_millis()).unwrap_or(u64::MAX),
                        host: host.clone(),
                        pid: std::process::id(),
                    };
                    let began = Instant::now();
                    if store.claim(&claim)? {
                        info!("leading as epoch {epoch}");
                        return Ok(Arc::new(Leadership {
                            store,
                            claim,
                            lease: Mutex::new(Lease::new(candidate.lease, began)),
                            renewals: Mutex::new(0),
                        }));
                    }
                    // Another standby was faster: watch its epoch.
                }
            }
        }
    }

    /// The epoch this coordinator leads.
    pub fn epoch(&self) -> u64 {
        self.claim.epoch
    }

    /// Renews the lease until leadership is lost (a renewal not written in time, a newer
    /// epoch), then calls `lost` once with why, on a thread of its own.
    pub fn keep(
        self: &Arc<Self>,
        lost: impl FnOnce(String) + Send + 'static,
    ) -> Result<(), String> {
        let me = self.clone();
        let every = Duration::from_millis(self.claim.lease_ms / 4).max(Duration::from_millis(5));
        std::thread::Builder::new()
            .name("leader-lease".into())
            .spawn(move || loop {
                me.renew();
                if let Err(why) = me.check() {
                    lost(why);
                    return;
                }
                std::thread::sleep(every);
            })
            .map(|_| ())
            .map_err(|e| format!("cannot start the lease renewal: {e}"))
    }

    fn renew(&self) {
        let began = Instant::now();
        let count = {
            let Ok(mut n) = self.renewals.lock() else {
                return;
            };
            *n += 1;
            *n
        };
        let renewal = Renewal {
            count,
            released: false,
        };
        match self.store.write_renewal(self.claim.epoch, renewal) {
            Ok(()) => {
                if let Ok(mut lease) = self.lease.lock() {
                    lease.renewed(began);
                }
            }
            Err(e) => warn!(
                "cannot renew the leader lease of epoch {}: {e}",
                self.claim.epoch
            ),
        }
    }

    /// Steps down: no write is allowed any more, and a standby may claim the next epoch at
    /// once.
    pub fn release(&self) {
        if let Ok(mut lease) = self.lease.lock() {
            lease.lose("it stepped down".into());
        }
        let count = self.renewals.lock().map(|n| *n + 1).unwrap_or(u64::MAX);
        let renewal = Renewal {
            count,
            released: true,
        };
        match self.store.write_renewal(self.claim.epoch, renewal) {
            Ok(()) => info!("stepped down from epoch {}", self.claim.epoch),
            Err(e) => error!(
                "cannot record that epoch {} stepped down ({e}); a standby takes over when its lease lapses",
                self.claim.epoch
            ),
        }
    }
}

impl Fence for Leadership {
    fn check(&self) -> Result<(), String> {
        let now = Instant::now();
        let mut lease = self
            .lease
            .lock()
            .map_err(|_| "the leader lease is poisoned".to_string())?;
        lease.check(now)?;
        let next = self.claim.epoch + 1;
        if self.store.claim_path(next).exists() {
            let by = self
                .store
                .read_claim(next)
                .map(|c| format!(" (by the coordinator at {}, pid {})", c.bind, c.pid))
                .unwrap_or_default();
            lease.lose(format!("epoch {next} was claimed{by}"));
            return lease.check(now);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(epoch: u64, lease_ms: u64) -> Claim {
        Claim {
            epoch,
            bind: "127.0.0.1:6123".into(),
            rest: "127.0.0.1:8081".into(),
            lease_ms,
            host: "h".into(),
            pid: 1,
        }
    }

    fn observed(epoch: u64, count: Option<u64>) -> Observed {
        Observed {
            claim: claim(epoch, 1000),
            renewal: count.map(|count| Renewal {
                count,
                released: false,
            }),
            holder_gone: false,
        }
    }

    #[test]
    fn a_standby_claims_only_after_watching_a_renewal_stay_put_for_the_lease() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut s = Standby::default();
        assert_eq!(s.observe(t0, None), Verdict::Claim(1));
        assert_eq!(s.observe(t0, Some(&observed(3, Some(7)))), Verdict::Wait);
        // Renewed in time: the watch starts again.
        assert_eq!(
            s.observe(t0 + ms(900), Some(&observed(3, Some(8)))),
            Verdict::Wait
        );
        assert_eq!(
            s.observe(t0 + ms(1900), Some(&observed(3, Some(8)))),
            Verdict::Wait,
            "1000 ms since the renewal was first seen is not yet the lease and its margin"
        );
        assert_eq!(
            s.observe(t0 + ms(900) + lapse(ms(1000)), Some(&observed(3, Some(8)))),
            Verdict::Claim(4)
        );
        // A newer epoch seen meanwhile is watched from scratch.
        let mut s = Standby::default();
        assert_eq!(s.observe(t0, Some(&observed(3, Some(8)))), Verdict::Wait);
        assert_eq!(
            s.observe(t0 + ms(5000), Some(&observed(4, None))),
            Verdict::Wait
        );
        // Released, or its holder gone: at once.
        let mut released = observed(4, Some(2));
        released.renewal = Some(Renewal {
            count: 3,
            released: true,
        });
        assert_eq!(s.observe(t0, Some(&released)), Verdict::Claim(5));
        let mut gone = observed(4, Some(2));
        gone.holder_gone = true;
        assert_eq!(
            Standby::default().observe(t0, Some(&gone)),
            Verdict::Claim(5)
        );
    }

    #[test]
    fn a_lease_refuses_after_its_deadline_and_for_good_once_lost() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut l = Lease::new(ms(1000), t0);
        assert!(l.check(t0 + ms(999)).is_ok());
        let late = l.check(t0 + ms(1000)).unwrap_err();
        assert!(late.contains("lease of 1000 ms lapsed"), "{late}");
        // A renewal that began before the deadline extends it from when it began.
        l.renewed(t0 + ms(500));
        assert!(l.check(t0 + ms(1499)).is_ok());
        assert!(l.check(t0 + ms(1500)).is_err());
        l.lose("epoch 2 was claimed".into());
        l.renewed(t0 + ms(1400));
        assert_eq!(l.check(t0 + ms(1450)).unwrap_err(), "epoch 2 was claimed");
    }

    fn candidate(dir: &Path, lease_ms: u64) -> Candidate {
        Candidate {
            checkpoint_dir: dir.to_path_buf(),
            bind: "127.0.0.1:0".into(),
            rest: "127.0.0.1:0".into(),
            lease: Duration::from_millis(lease_ms),
            same_host_takeover: false,
        }
    }

    #[test]
    fn the_next_coordinator_takes_over_a_lapsed_or_released_lease_and_fences_the_old_one() {
        let dir = tempfile::tempdir().unwrap();
        let first = Leadership::acquire(&candidate(dir.path(), 200), |_| {}).unwrap();
        assert_eq!(first.epoch(), 1);
        assert!(first.check().is_ok());
        // First never renews (as if paused): the next one waits out the lease, then claims.
        let began = Instant::now();
        let mut seen = Vec::new();
        let second =
            Leadership::acquire(&candidate(dir.path(), 200), |c| seen.push(c.epoch)).unwrap();
        assert!(began.elapsed() >= Duration::from_millis(200));
        assert_eq!((second.epoch(), seen), (2, vec![1]));
        let why = first.check().unwrap_err();
        assert!(
            why.contains("lapsed") || why.contains("epoch 2 was claimed"),
            "{why}"
        );
        // Second renews while a third waits; it steps down and the third takes over at once.
        second.keep(|_| {}).unwrap();
        let waiting = std::thread::spawn({
            let dir = dir.path().to_path_buf();
            move || Leadership::acquire(&candidate(&dir, 200), |_| {}).unwrap()
        });
        let start = Instant::now();
        while start.elapsed() < Duration::from_millis(600) {
            assert!(second.check().is_ok(), "a renewed lease holds");
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(!waiting.is_finished(), "no claim over a renewed lease");
        second.release();
        let third = waiting.join().unwrap();
        assert_eq!(third.epoch(), 3);
        assert!(second.check().unwrap_err().contains("stepped down"));
    }

    #[test]
    fn a_claim_by_a_process_of_this_host_that_is_gone_is_taken_over_at_once() {
        let host = host_identity();
        if host.is_empty() {
            // No /proc: the shortcut is off, and the lease is waited out (tested above).
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let store = Store {
            dir: dir.path().join(LEADER_DIR),
        };
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let gone = child.id();
        child.wait().unwrap();
        let mut c = claim(1, 60_000);
        c.host = host.clone();
        c.pid = gone;
        assert!(store.claim(&c).unwrap());
        let seen = store.observe(&host).unwrap().unwrap();
        assert!(seen.holder_gone);
        assert_eq!(
            Standby::default().observe(Instant::now(), Some(&seen)),
            Verdict::Claim(2)
        );
        // A live holder (this test's parent process stands in for one) is waited for.
        c.epoch = 2;
        c.pid = std::os::unix::process::parent_id();
        assert!(store.claim(&c).unwrap());
        let seen = store.observe(&host).unwrap().unwrap();
        assert!(!seen.holder_gone);
        // Another host's claim is never judged by its pid.
        assert!(
            !store
                .observe("elsewhere/boot")
                .unwrap()
                .unwrap()
                .holder_gone
        );
    }

    #[test]
    fn two_claims_of_one_epoch_have_one_winner() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store {
            dir: dir.path().join(LEADER_DIR),
        };
        let wins: usize = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|i| {
                    let store = store.clone();
                    s.spawn(move || {
                        let mut c = claim(1, 1000);
                        c.pid = 100 + i;
                        store.claim(&c).unwrap()
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| usize::from(h.join().unwrap()))
                .sum()
        });
        assert_eq!(wins, 1);
        assert_eq!(store.highest().unwrap(), Some(1));
    }
}
