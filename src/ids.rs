//! Where randomness and wall time enter: object uuids, Avro sync markers and file-name times.
//! Both can be pinned (`--seed`, `--fixed-time`) so users can golden-test their pipelines.

use chrono::{DateTime, Utc};
use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha12Rng;

/// Source of object uuids and Avro sync markers.
pub struct Ids {
    rng: ChaCha12Rng,
}

impl Ids {
    /// `Some(seed)` gives the same sequence on every run (golden tests only: two workers with one
    /// seed would pick the same names); `None` seeds from the operating system.
    pub fn new(seed: Option<u64>) -> Ids {
        let rng = match seed {
            Some(s) => ChaCha12Rng::seed_from_u64(s),
            None => ChaCha12Rng::from_os_rng(),
        };
        Ids { rng }
    }

    /// A random (version 4) UUID, lower-case hex with hyphens (docs/contract.md §6 Q1).
    pub fn uuid(&mut self) -> String {
        let mut b = [0u8; 16];
        self.rng.fill_bytes(&mut b);
        uuid::Builder::from_random_bytes(b)
            .into_uuid()
            .hyphenated()
            .to_string()
    }

    /// A 16-byte Avro sync marker.
    pub fn sync_marker(&mut self) -> [u8; 16] {
        let mut b = [0u8; 16];
        self.rng.fill_bytes(&mut b);
        b
    }
}

/// Wall clock for object names; fixed for golden tests.
#[derive(Debug, Clone, Copy, Default)]
pub struct Clock {
    pub fixed: Option<DateTime<Utc>>,
}

impl Clock {
    pub fn now(&self) -> DateTime<Utc> {
        self.fixed.unwrap_or_else(Utc::now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeded_ids_repeat_and_are_v4() {
        let (mut a, mut b) = (Ids::new(Some(7)), Ids::new(Some(7)));
        let u = a.uuid();
        assert_eq!(u, b.uuid());
        assert_eq!(a.sync_marker(), b.sync_marker());
        let parsed = uuid::Uuid::parse_str(&u).unwrap();
        assert_eq!(parsed.get_version_num(), 4);
        assert_eq!(u.len(), 36);
        assert_ne!(Ids::new(None).uuid(), Ids::new(None).uuid());
    }
}
