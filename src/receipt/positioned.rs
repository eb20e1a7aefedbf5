//! [`PositionedSource`]: a source whose messages carry stream positions, as error messages name it.

/// A source that can write exactly once into a bucket or a Delta table, as error messages name
/// it: its name (`NAME source`) and how it is given (`--source SCHEME://…`).
#[derive(Debug, Clone, Copy, Default)]
pub struct PositionedSource {
    pub name: &'static str,
    pub flag: &'static str,
}
