//! Flow control never starves the files (pure).
//!
//! A broker that honours flow control (NATS JetStream's `MaxAckPending`, Pub/Sub's
//! `max_outstanding_messages` / `max_outstanding_bytes`) sends nothing more once that many
//! messages (or bytes) are delivered and not yet settled. subsink settles a message only once the
//! file holding it is durable, so with the defaults (10,000 messages outstanding, files of up to
//! 5 minutes) the limit is reached while every outstanding message sits in an open file waiting
//! for `maxDuration`: the broker stops, the file fills no further, and a backlog moves one file per
//! `maxDuration`.
//!
//! [`pick`] says which open file to finalize early (reason `flow_control`) so the broker can send
//! more. The threshold is **half** of a limit (docs/decisions.md):
//! * nothing happens while what is outstanding (in open files and in flight to the destination)
//!   is below half of the limit;
//! * nothing is finalized while the files already in flight hold half of the limit or more —
//!   their settling frees at least that much, and the broker goes on;
//! * nothing is finalized while the open files hold no more than the files in flight — the open
//!   files keep filling;
//! * otherwise the open file that frees most is finalized (never a replay file, which must hold
//!   exactly its span).
//!
//! Where workers share one limit (a NATS consumer's `MaxAckPending`), they can reach it together
//! while each holds less than half: there the broker's word that it holds the source back
//! (`held_back`) stands in for the half.
//!
//! So a backlog moves in files of about half the limit, one being made durable while the next
//! one fills: the broker is never held back for a whole `maxDuration`.

use crate::message::Message;

/// A source's flow-control limits: how much may be outstanding (delivered, not yet settled)
/// before the broker sends nothing more. `None` in a dimension: no limit there.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FlowLimit {
    pub messages: Option<u64>,
    pub bytes: Option<u64>,
}

impl FlowLimit {
    /// A limit from a broker's setting, where 0 or less means none.
    pub fn new(messages: i64, bytes: i64) -> Option<FlowLimit> {
        let positive = |v: i64| u64::try_from(v).ok().filter(|v| *v > 0);
        let limit = FlowLimit {
            messages: positive(messages),
            bytes: positive(bytes),
        };
        (limit != FlowLimit::default()).then_some(limit)
    }
}

/// Messages and their bytes (as flow control counts them, [`message_bytes`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Held {
    pub messages: u64,
    pub bytes: u64,
}

impl std::ops::AddAssign for Held {
    fn add_assign(&mut self, o: Held) {
        self.messages += o.messages;
        self.bytes += o.bytes;
    }
}

/// An open file, as [`pick`] sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenFile {
    /// The file's id (opening order).
    pub id: u64,
    pub held: Held,
    /// A replay file (it must hold exactly the span a crashed run left pending): never picked.
    pub replay: bool,
}

/// The bytes of `msg` as a broker's flow control counts them: its data, attribute keys and
/// values, message id and ordering key (Pub/Sub counts the message as sent, a few bytes of
/// framing more).
pub fn message_bytes(msg: &Message) -> u64 {
    (msg.data.len() + msg.attributes.text_len() + msg.message_id.len() + msg.ordering_key.len())
        as u64
}

/// Which open file to finalize early so the broker sends more (see the module docs), if any:
/// `open` are the open files, `in_flight` what the files finalized and not yet settled hold;
/// `held_back`: the broker says it sends nothing more (its limit is shared with other workers,
/// whose messages count too: then the limit is reached even when this worker holds less than
/// half of it).
pub fn pick(limit: &FlowLimit, open: &[OpenFile], in_flight: Held, held_back: bool) -> Option<u64> {
    let mut open_total = Held::default();
    for f in open {
        open_total += f.held;
    }
    // The dimensions whose limit asks for a file.
    let pressed: Vec<(Dim, u64)> = [(Dim::Messages, limit.messages), (Dim::Bytes, limit.bytes)]
        .into_iter()
        .filter_map(|(d, l)| Some((d, l?)))
        .filter(|&(d, l)| presses(l, d.of(&open_total), d.of(&in_flight), held_back))
        .collect();
    if pressed.is_empty() {
        return None;
    }
    // What a file frees: its largest share of a pressed limit.
    let frees = |f: &OpenFile| -> f64 {
        pressed
            .iter()
            .map(|&(d, l)| d.of(&f.held) as f64 / l as f64)
            .fold(0.0, f64::max)
    };
    open.iter()
        .filter(|f| !f.replay && f.held.messages > 0)
        .max_by(|a, b| frees(a).total_cmp(&frees(b)).then(b.id.cmp(&a.id)))
        .map(|f| f.id)
}

/// Does `limit` ask for a file, with `open` held by the open files and `flying` by the files being
/// made durable? Yes once half of it is outstanding (or the broker says it holds the source back),
/// unless the files in flight hold half already (their settling frees that much) or the open files
/// hold no more than they do.
fn presses(limit: u64, open: u64, flying: u64, held_back: bool) -> bool {
    let half = limit.div_ceil(2);
    (open + flying >= half || held_back) && flying < half && open > flying
}

/// What flow control counts.
#[derive(Debug, Clone, Copy)]
enum Dim {
    Messages,
    Bytes,
}

impl Dim {
    fn of(self, h: &Held) -> u64 {
        match self {
            Dim::Messages => h.messages,
            Dim::Bytes => h.bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`super::pick`] for a broker that does not say it holds the source back.
    fn pick(limit: &FlowLimit, open: &[OpenFile], in_flight: Held) -> Option<u64> {
        super::pick(limit, open, in_flight, false)
    }

    fn held(messages: u64, bytes: u64) -> Held {
        Held { messages, bytes }
    }

    fn file(id: u64, messages: u64, bytes: u64) -> OpenFile {
        OpenFile {
            id,
            held: held(messages, bytes),
            replay: false,
        }
    }

    const MESSAGES: FlowLimit = FlowLimit {
        messages: Some(10_000),
        bytes: None,
    };

    #[test]
    fn below_half_of_the_limit_nothing_is_finalized() {
        assert_eq!(pick(&MESSAGES, &[file(1, 4_999, 0)], Held::default()), None);
        assert_eq!(pick(&MESSAGES, &[file(1, 3_000, 0)], held(1_999, 0)), None);
        assert_eq!(pick(&MESSAGES, &[], Held::default()), None);
        // No limit at all: never.
        let none = FlowLimit::default();
        assert_eq!(
            pick(&none, &[file(1, 1 << 40, 1 << 50)], Held::default()),
            None
        );
    }

    #[test]
    fn at_half_of_the_limit_the_open_file_is_finalized() {
        assert_eq!(
            pick(&MESSAGES, &[file(1, 5_000, 0)], Held::default()),
            Some(1)
        );
        // Outstanding counts the files in flight too, as long as the open files hold more.
        assert_eq!(
            pick(&MESSAGES, &[file(7, 3_000, 0)], held(2_000, 0)),
            Some(7)
        );
        // An odd limit: half rounds up.
        let odd = FlowLimit {
            messages: Some(3),
            bytes: None,
        };
        assert_eq!(pick(&odd, &[file(1, 1, 0)], Held::default()), None);
        assert_eq!(pick(&odd, &[file(1, 2, 0)], Held::default()), Some(1));
    }

    #[test]
    fn while_half_of_the_limit_is_in_flight_it_waits() {
        assert_eq!(pick(&MESSAGES, &[file(1, 5_000, 0)], held(5_000, 0)), None);
        assert_eq!(pick(&MESSAGES, &[file(1, 9_000, 0)], held(6_000, 0)), None);
        // Less in flight, but the open files hold no more than it: they keep filling (no tiny
        // files).
        assert_eq!(pick(&MESSAGES, &[file(1, 1, 0)], held(4_999, 0)), None);
        assert_eq!(pick(&MESSAGES, &[file(1, 2_500, 0)], held(2_500, 0)), None);
        assert_eq!(
            pick(&MESSAGES, &[file(1, 2_501, 0)], held(2_500, 0)),
            Some(1)
        );
    }

    #[test]
    fn the_open_file_that_frees_most_is_picked_never_a_replay_file() {
        let open = [file(1, 1_000, 0), file(2, 4_000, 0), file(3, 2_000, 0)];
        assert_eq!(pick(&MESSAGES, &open, Held::default()), Some(2));
        let mut replay = open;
        replay[1].replay = true;
        assert_eq!(pick(&MESSAGES, &replay, Held::default()), Some(3));
        let only_replay = [OpenFile {
            replay: true,
            ..file(1, 9_000, 0)
        }];
        assert_eq!(pick(&MESSAGES, &only_replay, Held::default()), None);
        // Equal: the older file.
        let tie = [file(4, 3_000, 0), file(3, 3_000, 0)];
        assert_eq!(pick(&MESSAGES, &tie, Held::default()), Some(3));
    }

    #[test]
    fn a_broker_holding_back_a_shared_limit_presses_below_half() {
        // Three workers on one NATS consumer of MaxAckPending 10,000, each holding 3,334: none
        // holds half, the consumer is at its limit.
        let open = [file(1, 3_334, 0)];
        assert_eq!(pick(&MESSAGES, &open, Held::default()), None);
        assert_eq!(
            super::pick(&MESSAGES, &open, Held::default(), true),
            Some(1)
        );
        // Still: not while half is in flight, nor while the open files hold no more than it.
        assert_eq!(super::pick(&MESSAGES, &open, held(5_000, 0), true), None);
        assert_eq!(super::pick(&MESSAGES, &open, held(3_334, 0), true), None);
        assert_eq!(super::pick(&MESSAGES, &[], Held::default(), true), None);
        // Without a limit the broker's word changes nothing.
        let none = FlowLimit::default();
        assert_eq!(super::pick(&none, &open, Held::default(), true), None);
    }

    #[test]
    fn the_bytes_limit_presses_alone() {
        let bytes = FlowLimit {
            messages: Some(10_000),
            bytes: Some(1_000_000),
        };
        // Few messages, many bytes: the bytes decide, and the file with most bytes goes.
        let open = [file(1, 90, 100_000), file(2, 10, 450_000)];
        assert_eq!(pick(&bytes, &open, Held::default()), Some(2));
        assert_eq!(pick(&bytes, &open[..1], Held::default()), None);
        // Half the bytes in flight: wait.
        assert_eq!(pick(&bytes, &open, held(10, 500_000)), None);
        // Only a bytes limit.
        let only = FlowLimit {
            messages: None,
            bytes: Some(1_000),
        };
        assert_eq!(pick(&only, &[file(5, 1, 500)], Held::default()), Some(5));
        assert_eq!(
            pick(&only, &[file(5, 1_000_000, 499)], Held::default()),
            None
        );
    }

    #[test]
    fn with_both_limits_pressed_the_larger_share_decides() {
        let both = FlowLimit {
            messages: Some(100),
            bytes: Some(1_000),
        };
        // File 1 holds 60 % of the messages, file 2 70 % of the bytes.
        let open = [file(1, 60, 100), file(2, 10, 700)];
        assert_eq!(pick(&both, &open, Held::default()), Some(2));
        let open = [file(1, 80, 100), file(2, 10, 700)];
        assert_eq!(pick(&both, &open, Held::default()), Some(1));
    }

    #[test]
    fn limits_from_broker_settings() {
        assert_eq!(FlowLimit::new(0, 0), None);
        assert_eq!(FlowLimit::new(-1, 0), None);
        assert_eq!(
            FlowLimit::new(10_000, 0),
            Some(FlowLimit {
                messages: Some(10_000),
                bytes: None
            })
        );
        assert_eq!(
            FlowLimit::new(0, 5),
            Some(FlowLimit {
                messages: None,
                bytes: Some(5)
            })
        );
    }

    #[test]
    fn message_bytes_count_data_attributes_id_and_key() {
        let mut m = Message {
            data: bytes::Bytes::from_static(b"12345"),
            message_id: "42".into(),
            ordering_key: "k".into(),
            ..Default::default()
        };
        m.attributes = [("ab", "cde")].into();
        assert_eq!(message_bytes(&m), 5 + 5 + 2 + 1);
    }
}
