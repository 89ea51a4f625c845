//! The nemesis: one fault at a time at seeded moments, each healed before the next.
//!
//! Log engine (one node): SIGKILL and restart, a SIGSTOP pause, a full disk (when the run has
//! its tmpfs). PostgreSQL (two nodes, primary + synchronous standby, each in its own namespace):
//! a node cut off from both databases, the clients cut off from a node, the primary cut off from
//! its standby, a slow and lossy link, a paused node, a paused primary, SIGKILL of a node, a
//! failover (half the time of a primary cut off from its standby first), and a node restarted with its wall clock skewed (forward or backward) or back to
//! the true time. Durations go past the nodes' 5 s request deadline and the subscription's 3 s
//! lease at times.
//!
//! Log engine on a bucket (one node, `--ack-mode bucket`, the bucket behind a fault proxy):
//! disk loss (SIGKILL, the data directory deleted, restart: the node restores from the bucket),
//! the bucket unreachable (1-10 s), throttling (every third request `503 SlowDown`, 1-5 s), slow
//! answers (200-800 ms each, 1-5 s), PUTs stored whose answers are lost (1-5 s), and the log
//! engine's SIGKILL and restart and SIGSTOP pause. Past the node's 2 s `--bucket-ack-timeout`
//! writes are answered 503 (outcome unknown), as by a paused or stopped node.

use std::time::Duration;

use rand::Rng;

use oncelog_bucket::fault_proxy::{Fault, FaultProxy};

use super::cluster::{Node, NodeError, SmallDisk};
use super::net::{Net, NetError};
use super::pg::{PgError, PgPair};

#[derive(Debug, thiserror::Error)]
pub enum FaultError {
    #[error(transparent)]
    Node(#[from] NodeError),
    #[error(transparent)]
    Net(#[from] NetError),
    #[error(transparent)]
    Pg(#[from] PgError),
}

/// Everything the run started, ended in this order when dropped: the nodes, then the bucket's
/// proxy, then the databases, then the network under them, then the disk.
pub struct System {
    pub nodes: Vec<Node>,
    pub bucket: Option<BucketSide>,
    pub pg: Option<PgPair>,
    pub net: Option<Net>,
    pub disk: Option<SmallDisk>,
}

/// The log engine on a bucket: the fault proxy the node reaches the bucket through, and the
/// node's data directory (deleted by a disk loss).
pub struct BucketSide {
    pub proxy: FaultProxy,
    pub data: std::path::PathBuf,
}

fn ms(rng: &mut impl Rng, from: u64, to: u64) -> Duration {
    Duration::from_millis(rng.random_range(from..to))
}

impl System {
    /// Injects one fault drawn from `rng`, waits it out, heals it; its name.
    pub fn fault(&mut self, rng: &mut impl Rng) -> Result<&'static str, FaultError> {
        match (&mut self.pg, &self.net) {
            (Some(pg), Some(net)) => pg_fault(&mut self.nodes, pg, net, rng),
            _ if self.bucket.is_some() => self.bucket_fault(rng),
            _ => self.log_fault(rng),
        }
    }

    /// One fault of the log engine on a bucket (see the module docs), healed before it returns.
    fn bucket_fault(&mut self, rng: &mut impl Rng) -> Result<&'static str, FaultError> {
        let Some(bucket) = &self.bucket else { return self.log_fault(rng) };
        let node = &mut self.nodes[0];
        let roll: f64 = rng.random();
        // The proxy misbehaves for a while, then passes everything again.
        let spell = |fault: Fault, hold: Duration| {
            bucket.proxy.set(fault);
            std::thread::sleep(hold);
            bucket.proxy.set(Fault::Pass);
        };
        let kind = if roll < 0.2 {
            // The disk is gone: what the node acknowledged is in the bucket, and a node started
            // on an empty directory restores it.
            node.kill9();
            let _ = std::fs::remove_dir_all(&bucket.data);
            std::thread::sleep(ms(rng, 0, 500));
            node.restart()?;
            "disk loss"
        } else if roll < 0.35 {
            spell(Fault::Down, ms(rng, 1000, 10_000));
            "bucket down"
        } else if roll < 0.5 {
            spell(Fault::Throttle(3), ms(rng, 1000, 5000));
            "bucket throttling"
        } else if roll < 0.65 {
            let each = ms(rng, 200, 800);
            spell(Fault::Slow(each), ms(rng, 1000, 5000));
            "bucket slow"
        } else if roll < 0.8 {
            spell(Fault::LosePutAnswers, ms(rng, 1000, 5000));
            "bucket lost answers"
        } else if roll < 0.9 {
            node.pause(ms(rng, 500, 6000));
            "pause"
        } else {
            node.kill9();
            std::thread::sleep(ms(rng, 0, 500));
            node.restart()?;
            "SIGKILL"
        };
        Ok(kind)
    }

    fn log_fault(&mut self, rng: &mut impl Rng) -> Result<&'static str, FaultError> {
        let roll: f64 = rng.random();
        let node = &mut self.nodes[0];
        match &self.disk {
            // Frozen for longer than the clients' 5 s timeout at times, then resumed.
            _ if roll < 0.25 => {
                node.pause(ms(rng, 500, 6000));
                Ok("pause")
            }
            // A full disk for a while: writes fail (the engine stops taking them), then space
            // comes back and the node is restarted.
            Some(d) if roll < 0.5 => {
                d.fill();
                std::thread::sleep(ms(rng, 500, 2000));
                d.free();
                node.restart()?;
                Ok("disk full")
            }
            _ => {
                node.kill9();
                std::thread::sleep(ms(rng, 0, 500));
                node.restart()?;
                Ok("SIGKILL")
            }
        }
    }
}

/// One fault of the PostgreSQL system (see the module docs), healed before it returns.
fn pg_fault(nodes: &mut [Node], pg: &mut PgPair, net: &Net, rng: &mut impl Rng) -> Result<&'static str, FaultError> {
    let i = rng.random_range(0..nodes.len());
    let node = format!("n{i}");
    let (primary, standby) = pg.primary_and_standby();
    let (primary, standby) = (format!("db{primary}"), format!("db{standby}"));
    let roll: f64 = rng.random();
    let hold = |rng: &mut _| std::thread::sleep(ms(rng, 1000, 8000));
    let kind = if roll < 0.15 {
        net.partition(&node, Some("db0"))?;
        net.partition(&node, Some("db1"))?;
        hold(rng);
        "partition node-db"
    } else if roll < 0.25 {
        net.partition(&node, None)?;
        hold(rng);
        "partition clients-node"
    } else if roll < 0.35 {
        net.partition(&primary, Some(&standby))?;
        hold(rng);
        "partition primary-standby"
    } else if roll < 0.45 {
        net.slow(&node)?;
        hold(rng);
        "slow link"
    } else if roll < 0.55 {
        nodes[i].pause(ms(rng, 500, 7000));
        "pause node"
    } else if roll < 0.65 {
        pg.pause_primary(ms(rng, 500, 7000));
        "pause primary"
    } else if roll < 0.75 {
        nodes[i].kill9();
        std::thread::sleep(ms(rng, 0, 500));
        nodes[i].restart()?;
        "SIGKILL node"
    } else if roll < 0.85 {
        // Half the time the primary is first cut off from its standby for a while: what it
        // acknowledges then (nothing, with synchronous replication) dies with it.
        let isolated = rng.random::<bool>();
        if isolated {
            net.partition(&primary, Some(&standby))?;
            std::thread::sleep(ms(rng, 1000, 3000));
        }
        pg.crash_primary()?;
        net.heal();
        pg.promote()?;
        if isolated {
            "failover of an isolated primary"
        } else {
            "failover"
        }
    } else {
        // Minutes off either way, or back to the true time.
        let n = &mut nodes[i];
        let skew = if n.skew_ms == 0 {
            rng.random_range(5_000..120_000) * if rng.random::<bool>() { 1 } else { -1 }
        } else {
            0
        };
        n.restart_skewed(skew)?;
        "clock skew"
    };
    net.heal();
    Ok(kind)
}
