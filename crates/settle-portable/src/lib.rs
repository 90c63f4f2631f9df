//! The portable export format of SPEC §12: one versioned, self-describing,
//! checksummed stream for backup, restore and moving between engines
//! (`docs/export-format.md` describes it byte by byte).
//!
//! A file is lines of `CRC SP JSON LF`: `CRC` is the CRC-32 (IEEE, as in
//! zlib) of the JSON text in eight lowercase hex digits. The first line is
//! the header, the last the trailer; between them every entity of the store
//! in one canonical order (records, then principals, then warning tasks;
//! each by tenant, then name), so that two stores holding the same entities
//! export the same bytes (the per-tenant digests `settle migrate` compares).
//! The trailer holds the counts and the SHA-256 of every byte before it.
//!
//! A [`Reader`] hands out nothing that failed its line's checksum, and a
//! file is only known whole once its trailer checked: importers verify a
//! file first ([`verify`]) and write only then.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{BufRead, Read, Write};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};
use settle_core::{Principal, PrincipalState, Record, TaskId, TenantId, Warning};
use sha2::{Digest as _, Sha256};

/// The header's `format`: what this file is.
pub const FORMAT: &str = "settle-export";
/// The version this build writes, and the newest it reads. 2: leases carry
/// their `claim_id` (SPEC §4 rule 5a); version 1 files are still read
/// (their leases have none).
pub const VERSION: u32 = 2;
/// The oldest version this build reads.
pub const OLDEST_VERSION: u32 = 1;
/// The engines a file may come from (the header's `engine`).
pub const ENGINES: [&str; 3] = ["embedded", "postgres", "memory"];
/// The highest fence counter an import may set (SPEC §12): fences stay
/// exact in every client language (JavaScript's 2^53 − 1) with 2^32
/// fences to spare after it.
pub const MAX_FENCE_FLOOR: u64 = (1 << 53) - 1 - (1 << 32);
/// The largest `--fence-margin` an import takes (SPEC §12).
pub const MAX_FENCE_MARGIN: u64 = 1 << 50;
/// What a version-1 header (which has no `fences_per_claim_max`) means:
/// PostgreSQL servers drew 128 fences ahead with each batch holding a claim
/// then, so one claim could consume 129; the other engines one.
const V1_POSTGRES_FENCES_PER_CLAIM: u64 = 129;

/// The longest line a reader accepts (a record with the largest results and
/// every attempt kept is far below it): a damaged length never makes a
/// reader take all memory.
pub const MAX_LINE: usize = 64 << 20;

/// One stored entity of a tenant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Entity {
    /// A record (reservation, attempts, quarantine, receipt).
    Record {
        /// Its tenant.
        tenant: TenantId,
        /// The record as stored.
        record: Record,
    },
    /// A principal's generation and its recent moves.
    Principal {
        /// Its tenant.
        tenant: TenantId,
        /// The principal.
        principal: Principal,
        /// Its state as stored.
        state: PrincipalState,
    },
    /// The warnings of one task.
    Warnings {
        /// Its tenant.
        tenant: TenantId,
        /// The task.
        task: TaskId,
        /// Its warnings as stored.
        warnings: Vec<Warning>,
    },
}

impl Entity {
    /// The tenant it belongs to.
    pub fn tenant(&self) -> &TenantId {
        match self {
            Entity::Record { tenant, .. }
            | Entity::Principal { tenant, .. }
            | Entity::Warnings { tenant, .. } => tenant,
        }
    }

    /// Its place in the canonical order: section (records, principals,
    /// warning tasks), tenant, name.
    pub fn order(&self) -> (u8, &str, &str) {
        match self {
            Entity::Record { tenant, record } => (0, tenant.as_str(), record.key.as_str()),
            Entity::Principal {
                tenant, principal, ..
            } => (1, tenant.as_str(), principal.as_str()),
            Entity::Warnings { tenant, task, .. } => (2, tenant.as_str(), task.as_str()),
        }
    }

    /// The highest fence the entity holds (a record's newest lease).
    pub fn max_fence(&self) -> Option<u64> {
        match self {
            Entity::Record { record, .. } => record.last_fence().map(|f| f.0),
            _ => None,
        }
    }
}

/// The first line.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Header {
    /// Always `"header"`.
    pub kind: String,
    /// Always [`FORMAT`].
    pub format: String,
    /// The format version ([`VERSION`] when this build wrote it).
    pub version: u32,
    /// The engine it was exported from (`embedded`, `postgres`, `memory`).
    pub engine: String,
    /// When the snapshot was taken (RFC 3339, UTC).
    pub created_at: String,
    /// The source's fence counter at the snapshot: every fence it had
    /// granted was below it.
    pub fence_floor: u64,
    /// How many fences one claim may consume on the source's engine (a
    /// PostgreSQL server draws fences ahead in blocks): a margin of `m`
    /// covers at least `m / fences_per_claim_max` claims made after the
    /// snapshot. Since version 2; absent in version 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fences_per_claim_max: Option<u64>,
}

impl Header {
    /// A header for a snapshot of `engine` taken now, whose claims consume
    /// at most `fences_per_claim_max` fences each.
    pub fn new(engine: &str, fence_floor: u64, fences_per_claim_max: u64) -> Header {
        Header {
            kind: "header".into(),
            format: FORMAT.into(),
            version: VERSION,
            engine: engine.into(),
            created_at: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
            fence_floor,
            fences_per_claim_max: Some(fences_per_claim_max),
        }
    }

    /// Fences one claim may consume on the source's engine (for version 1
    /// files, what that engine did then).
    pub fn fences_per_claim(&self) -> u64 {
        match self.fences_per_claim_max {
            Some(n) => n,
            None if self.engine == "postgres" => V1_POSTGRES_FENCES_PER_CLAIM,
            None => 1,
        }
    }

    /// SPEC §12 "What import trusts": the header as this build writes it
    /// for its version (canonical JSON, a known engine, a real time).
    fn check(&self, json: &[u8]) -> Result<(), String> {
        if self.kind != "header" {
            return Err(format!("the header's kind is {:?}", self.kind));
        }
        if !ENGINES.contains(&self.engine.as_str()) {
            return Err(format!(
                "the header's engine {:?} is none of {ENGINES:?}",
                self.engine
            ));
        }
        if humantime::parse_rfc3339(&self.created_at).is_err() {
            return Err(format!(
                "the header's created_at {:?} is not an RFC 3339 time (UTC)",
                self.created_at
            ));
        }
        match (self.version, self.fences_per_claim_max) {
            (1, Some(_)) => {
                return Err("a version 1 header has no fences_per_claim_max".into());
            }
            (1, None) => {}
            (_, None) => return Err("the header has no fences_per_claim_max".into()),
            (_, Some(0)) => return Err("the header's fences_per_claim_max is 0".into()),
            (_, Some(_)) => {}
        }
        let again = serde_json::to_vec(self).map_err(|e| e.to_string())?;
        if again != json {
            return Err("the header is not in canonical form (members in order, no spaces)".into());
        }
        Ok(())
    }
}

/// The last line.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Trailer {
    /// Always `"trailer"`.
    pub kind: String,
    /// Record lines.
    pub records: u64,
    /// Principal lines.
    pub principals: u64,
    /// Warning-task lines.
    pub warning_tasks: u64,
    /// The highest fence any record line holds (0: none).
    pub max_fence: u64,
    /// The source's fence counter when the stream ended (a live source may
    /// have granted fences after its snapshot).
    pub fence_floor: u64,
    /// SHA-256 of every byte before this line, lowercase hex.
    pub sha256: String,
}

/// What a written or verified file holds.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Summary {
    /// The source engine.
    pub engine: String,
    /// The header's `created_at`.
    pub created_at: String,
    /// Record lines.
    pub records: u64,
    /// Principal lines.
    pub principals: u64,
    /// Warning-task lines.
    pub warning_tasks: u64,
    /// The highest fence a record holds.
    pub max_fence: u64,
    /// The highest fence counter the file saw (header and trailer).
    pub fence_floor: u64,
    /// How many fences one claim may consume on the source's engine
    /// ([`Header::fences_per_claim`]).
    pub fences_per_claim_max: u64,
    /// The file's length.
    pub bytes: u64,
    /// The trailer's digest.
    pub sha256: String,
    /// Per tenant: counts and the SHA-256 of its entity lines' JSON.
    pub tenants: BTreeMap<String, TenantSummary>,
}

impl Summary {
    /// The fence counter an importing store starts at: past every fence the
    /// file saw, plus `margin` for fences a live source granted after it.
    /// Refused (SPEC §12) when the margin is over [`MAX_FENCE_MARGIN`] or
    /// the floor would pass [`MAX_FENCE_FLOOR`]: fences would lose
    /// precision in JavaScript clients, or wrap.
    pub fn import_floor(&self, margin: u64) -> Result<u64, Error> {
        if margin > MAX_FENCE_MARGIN {
            return Err(Error::FenceBound(format!(
                "the fence margin {margin} is over the largest allowed, 2^50 ({MAX_FENCE_MARGIN})"
            )));
        }
        let seen = self.fence_floor.max(self.max_fence.saturating_add(1));
        match seen.checked_add(margin) {
            Some(floor) if floor <= MAX_FENCE_FLOOR => Ok(floor),
            _ => Err(Error::FenceBound(format!(
                "the file's fences (counter {seen}) plus the margin {margin} pass the highest \
                 fence floor allowed, 2^53 - 1 - 2^32 ({MAX_FENCE_FLOOR})"
            ))),
        }
    }

    /// How many claims made on the source after its snapshot `margin`
    /// surely covers (each consumes at most `fences_per_claim_max` fences).
    pub fn claims_covered(&self, margin: u64) -> u64 {
        margin / self.fences_per_claim_max.max(1)
    }
}

/// One tenant's part of a file.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct TenantSummary {
    /// Record lines.
    pub records: u64,
    /// Principal lines.
    pub principals: u64,
    /// Warning-task lines.
    pub warning_tasks: u64,
    /// SHA-256 of the JSON text of its entity lines, each followed by LF,
    /// in file order: equal entities give equal digests on every engine.
    pub sha256: String,
}

/// Why a file cannot be written or read.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading or writing failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The first line is not a settle export header.
    #[error("not a settle export: {0}")]
    NotAnExport(String),
    /// Written by a newer settle.
    #[error(
        "format version {found} is newer than this build reads (version {VERSION}); use a newer settle"
    )]
    NewerVersion {
        /// The header's version.
        found: u32,
    },
    /// A line fails its checksum, does not parse, is out of order, or the
    /// trailer disagrees with what came before it.
    #[error("damaged at byte {offset}: {reason}")]
    Damaged {
        /// Where the offending line starts.
        offset: u64,
        /// What is wrong there.
        reason: String,
    },
    /// The file ends before its trailer.
    #[error("truncated at byte {offset}: {reason}")]
    Truncated {
        /// Where the file ends.
        offset: u64,
        /// What was expected there.
        reason: String,
    },
    /// A writer was handed entities out of the canonical order, twice, or
    /// one that does not encode.
    #[error("cannot write: {0}")]
    Write(String),
    /// The fence floor an import would set is out of bounds (SPEC §12).
    #[error("refused: {0}")]
    FenceBound(String),
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RecordLine {
    kind: String,
    tenant: TenantId,
    record: Record,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct PrincipalLine {
    kind: String,
    tenant: TenantId,
    principal: Principal,
    state: PrincipalState,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct WarningsLine {
    kind: String,
    tenant: TenantId,
    task: TaskId,
    warnings: Vec<Warning>,
}

#[derive(Deserialize)]
struct Kind<'a> {
    #[serde(borrow)]
    kind: &'a str,
}

/// A record line as version 1 wrote it: leases without `claim_id`.
#[derive(Serialize)]
struct RecordLineV1 {
    kind: String,
    tenant: TenantId,
    record: settle_core::legacy::v2::Record,
}

/// An entity's line in this build's version.
fn entity_json(e: &Entity) -> serde_json::Result<Vec<u8>> {
    entity_json_of(e, VERSION)
}

/// An entity's line as a file of `version` holds it (the canonical form a
/// reader checks each line against).
fn entity_json_of(e: &Entity, version: u32) -> serde_json::Result<Vec<u8>> {
    match e {
        Entity::Record { tenant, record } if version == 1 => serde_json::to_vec(&RecordLineV1 {
            kind: "record".into(),
            tenant: tenant.clone(),
            record: record.into(),
        }),
        Entity::Record { tenant, record } => serde_json::to_vec(&RecordLine {
            kind: "record".into(),
            tenant: tenant.clone(),
            record: record.clone(),
        }),
        Entity::Principal {
            tenant,
            principal,
            state,
        } => serde_json::to_vec(&PrincipalLine {
            kind: "principal".into(),
            tenant: tenant.clone(),
            principal: principal.clone(),
            state: *state,
        }),
        Entity::Warnings {
            tenant,
            task,
            warnings,
        } => serde_json::to_vec(&WarningsLine {
            kind: "warnings".into(),
            tenant: tenant.clone(),
            task: task.clone(),
            warnings: warnings.clone(),
        }),
    }
}

/// What writer and reader both keep: the digests, counts and order.
#[derive(Default)]
struct Tally {
    whole: Sha256,
    bytes: u64,
    tenants: BTreeMap<String, (TenantSummary, Sha256)>,
    records: u64,
    principals: u64,
    warning_tasks: u64,
    max_fence: u64,
    last: Option<(u8, String, String)>,
}

impl Tally {
    /// Counts one entity line; `Err` with the reason if it is not after the last.
    fn entity(&mut self, e: &Entity, json: &[u8]) -> Result<(), String> {
        let (section, tenant, name) = e.order();
        if let Some((s, t, n)) = &self.last
            && (*s, t.as_str(), n.as_str()) >= (section, tenant, name)
        {
            return Err(format!(
                "entity {tenant}/{name} (section {section}) is not after {t}/{n} (section {s}): \
                 entities are in canonical order, each once"
            ));
        }
        self.last = Some((section, tenant.into(), name.into()));
        let (t, h) = self.tenants.entry(tenant.into()).or_default();
        match e {
            Entity::Record { .. } => {
                self.records += 1;
                t.records += 1;
            }
            Entity::Principal { .. } => {
                self.principals += 1;
                t.principals += 1;
            }
            Entity::Warnings { .. } => {
                self.warning_tasks += 1;
                t.warning_tasks += 1;
            }
        }
        h.update(json);
        h.update(b"\n");
        if let Some(f) = e.max_fence() {
            self.max_fence = self.max_fence.max(f);
        }
        Ok(())
    }

    fn line(&mut self, line: &[u8]) {
        self.whole.update(line);
        self.bytes += line.len() as u64;
    }

    fn summary(self, header: &Header, trailer: &Trailer, bytes: u64) -> Summary {
        Summary {
            engine: header.engine.clone(),
            created_at: header.created_at.clone(),
            records: self.records,
            principals: self.principals,
            warning_tasks: self.warning_tasks,
            max_fence: self.max_fence,
            fence_floor: header.fence_floor.max(trailer.fence_floor),
            fences_per_claim_max: header.fences_per_claim(),
            bytes,
            sha256: trailer.sha256.clone(),
            tenants: self
                .tenants
                .into_iter()
                .map(|(k, (mut t, h))| {
                    t.sha256 = hex::encode(h.finalize());
                    (k, t)
                })
                .collect(),
        }
    }
}

fn framed(json: &[u8]) -> Vec<u8> {
    let mut line = Vec::with_capacity(json.len() + 10);
    line.extend_from_slice(format!("{:08x} ", crc32fast::hash(json)).as_bytes());
    line.extend_from_slice(json);
    line.push(b'\n');
    line
}

/// Writes a file: the header at once, each entity in canonical order, the
/// trailer at [`Writer::finish`].
pub struct Writer<W: Write> {
    out: W,
    header: Header,
    tally: Tally,
}

impl<W: Write> Writer<W> {
    /// Starts a file with `header`.
    pub fn new(out: W, header: Header) -> Result<Writer<W>, Error> {
        let mut w = Writer {
            out,
            header,
            tally: Tally::default(),
        };
        let json = serde_json::to_vec(&w.header).map_err(|e| Error::Write(e.to_string()))?;
        w.put(&framed(&json))?;
        Ok(w)
    }

    fn put(&mut self, line: &[u8]) -> Result<(), Error> {
        self.out.write_all(line)?;
        self.tally.line(line);
        Ok(())
    }

    /// Appends one entity; it must come after the last in canonical order.
    pub fn write(&mut self, e: &Entity) -> Result<(), Error> {
        let json = entity_json(e).map_err(|err| Error::Write(err.to_string()))?;
        self.tally.entity(e, &json).map_err(Error::Write)?;
        self.put(&framed(&json))
    }

    /// Entities written so far.
    pub fn entities(&self) -> u64 {
        self.tally.records + self.tally.principals + self.tally.warning_tasks
    }

    /// Bytes written so far.
    pub fn bytes(&self) -> u64 {
        self.tally.bytes
    }

    /// Ends the file with its trailer (`fence_floor`: the source's fence
    /// counter now) and flushes it; gives back the output and the summary.
    pub fn finish(mut self, fence_floor: u64) -> Result<(W, Summary), Error> {
        let whole = std::mem::take(&mut self.tally.whole);
        let trailer = Trailer {
            kind: "trailer".into(),
            records: self.tally.records,
            principals: self.tally.principals,
            warning_tasks: self.tally.warning_tasks,
            max_fence: self.tally.max_fence,
            fence_floor,
            sha256: hex::encode(whole.finalize()),
        };
        let json = serde_json::to_vec(&trailer).map_err(|e| Error::Write(e.to_string()))?;
        let line = framed(&json);
        self.out.write_all(&line)?;
        self.out.flush()?;
        let bytes = self.tally.bytes + line.len() as u64;
        let summary = self.tally.summary(&self.header, &trailer, bytes);
        Ok((self.out, summary))
    }
}

/// Reads a file entity by entity, checking each line's checksum, the order,
/// and at the end the trailer's counts and digest.
pub struct Reader<R: BufRead> {
    inp: R,
    offset: u64,
    header: Header,
    tally: Tally,
    trust: Trust,
    summary: Option<Summary>,
    buf: Vec<u8>,
}

impl<R: BufRead> Reader<R> {
    /// Reads and checks the header.
    pub fn new(inp: R) -> Result<Reader<R>, Error> {
        let mut r = Reader {
            inp,
            offset: 0,
            header: Header::new("", 0, 1),
            tally: Tally::default(),
            trust: Trust::default(),
            summary: None,
            buf: Vec::new(),
        };
        let Some(json) = r.line().map_err(|e| match e {
            Error::Truncated { .. } | Error::Damaged { .. } => {
                Error::NotAnExport(format!("no header line at byte 0 ({e})"))
            }
            e => e,
        })?
        else {
            return Err(Error::NotAnExport("the file is empty".into()));
        };
        let kind: Kind<'_> = serde_json::from_slice(&json)
            .map_err(|e| Error::NotAnExport(format!("the first line is not a header: {e}")))?;
        if kind.kind != "header" {
            return Err(Error::NotAnExport(format!(
                "the first line is a {:?} line, not the header",
                kind.kind
            )));
        }
        // The version is read before the rest: a newer header may have fields this build does not know.
        #[derive(Deserialize)]
        struct Version<'a> {
            #[serde(borrow)]
            format: &'a str,
            version: u32,
        }
        let v: Version<'_> = serde_json::from_slice(&json)
            .map_err(|e| Error::NotAnExport(format!("the header does not parse: {e}")))?;
        if v.format != FORMAT {
            return Err(Error::NotAnExport(format!(
                "the header's format is {:?}, not {FORMAT:?}",
                v.format
            )));
        }
        if v.version > VERSION {
            return Err(Error::NewerVersion { found: v.version });
        }
        if v.version < OLDEST_VERSION {
            return Err(Error::Damaged {
                offset: 0,
                reason: format!(
                    "format version {} does not exist (this build reads {OLDEST_VERSION} to {VERSION})",
                    v.version
                ),
            });
        }
        r.header = serde_json::from_slice(&json).map_err(|e| Error::Damaged {
            offset: 0,
            reason: format!("the header does not parse: {e}"),
        })?;
        r.header
            .check(&json)
            .map_err(|reason| Error::Damaged { offset: 0, reason })?;
        Ok(r)
    }

    /// The header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// Bytes read so far.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The summary, once the trailer has been read and checked.
    pub fn summary(&self) -> Option<&Summary> {
        self.summary.as_ref()
    }

    /// The next line's JSON (checksum checked), or `None` at the end of the input.
    fn line(&mut self) -> Result<Option<Vec<u8>>, Error> {
        let start = self.offset;
        self.buf.clear();
        let n = (&mut self.inp)
            .take(MAX_LINE as u64 + 10)
            .read_until(b'\n', &mut self.buf)?;
        if n == 0 {
            return Ok(None);
        }
        self.offset += n as u64;
        if self.buf.last() != Some(&b'\n') {
            if n > MAX_LINE {
                return Err(Error::Damaged {
                    offset: start,
                    reason: format!("a line longer than {MAX_LINE} bytes"),
                });
            }
            return Err(Error::Truncated {
                offset: start,
                reason: "the last line has no end".into(),
            });
        }
        let line = &self.buf[..n - 1];
        let damaged = |reason: &str| Error::Damaged {
            offset: start,
            reason: reason.into(),
        };
        if line.len() < 9 || line[8] != b' ' {
            return Err(damaged("a line does not start with its checksum"));
        }
        // Lowercase only: one spelling per checksum, so no flipped bit is
        // read as the same value.
        if !line[..8]
            .iter()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        {
            return Err(damaged(
                "a line's checksum is not eight lowercase hex digits",
            ));
        }
        let crc = u32::from_str_radix(std::str::from_utf8(&line[..8]).expect("hex"), 16)
            .expect("eight hex digits");
        let json = &line[9..];
        if crc32fast::hash(json) != crc {
            return Err(damaged("the line fails its checksum"));
        }
        let json = json.to_vec();
        let whole = std::mem::take(&mut self.buf);
        self.tally.line(&whole);
        self.buf = whole;
        Ok(Some(json))
    }

    /// The next entity; `None` once the trailer has been read and checked.
    pub fn next_entity(&mut self) -> Result<Option<Entity>, Error> {
        if self.summary.is_some() {
            return Ok(None);
        }
        let start = self.offset;
        // The digest the trailer must state: every byte before it.
        let before = self.tally.whole.clone();
        let Some(json) = self.line()? else {
            return Err(Error::Truncated {
                offset: start,
                reason: "the file ends before its trailer".into(),
            });
        };
        let damaged = |reason: String| Error::Damaged {
            offset: start,
            reason,
        };
        let kind: Kind<'_> = serde_json::from_slice(&json)
            .map_err(|e| damaged(format!("a line does not parse: {e}")))?;
        let parsed =
            |e: serde_json::Error| damaged(format!("a {} line does not parse: {e}", kind.kind));
        let entity = match kind.kind {
            "record" => {
                let l: RecordLine = serde_json::from_slice(&json).map_err(parsed)?;
                Entity::Record {
                    tenant: l.tenant,
                    record: l.record,
                }
            }
            "principal" => {
                let l: PrincipalLine = serde_json::from_slice(&json).map_err(parsed)?;
                Entity::Principal {
                    tenant: l.tenant,
                    principal: l.principal,
                    state: l.state,
                }
            }
            "warnings" => {
                let l: WarningsLine = serde_json::from_slice(&json).map_err(parsed)?;
                Entity::Warnings {
                    tenant: l.tenant,
                    task: l.task,
                    warnings: l.warnings,
                }
            }
            "trailer" => {
                let t: Trailer = serde_json::from_slice(&json).map_err(parsed)?;
                if serde_json::to_vec(&t).map_err(|e| damaged(e.to_string()))? != json {
                    return Err(damaged(
                        "the trailer is not in canonical form (members in order, no spaces)".into(),
                    ));
                }
                self.check_trailer(&t, before, start)?;
                self.trust
                    .end()
                    .map_err(|(offset, reason)| Error::Damaged { offset, reason })?;
                let mut rest = [0u8; 1];
                if self.inp.read(&mut rest)? != 0 {
                    return Err(Error::Damaged {
                        offset: self.offset,
                        reason: "bytes after the trailer".into(),
                    });
                }
                let tally = std::mem::take(&mut self.tally);
                self.summary = Some(tally.summary(&self.header, &t, self.offset));
                return Ok(None);
            }
            other => return Err(damaged(format!("unknown line kind {other:?}"))),
        };
        // The line's own JSON is what was hashed and written: a re-encoding
        // that differs means the file was not written by a settle exporter
        // of this version (a field reordered, spaces added).
        let again =
            entity_json_of(&entity, self.header.version).map_err(|e| damaged(e.to_string()))?;
        if again != json {
            return Err(damaged(
                "the line is not in canonical form (its entity encodes differently)".into(),
            ));
        }
        self.tally.entity(&entity, &json).map_err(damaged)?;
        self.trust.entity(&entity, start).map_err(damaged)?;
        Ok(Some(entity))
    }

    fn check_trailer(&self, t: &Trailer, before: Sha256, offset: u64) -> Result<(), Error> {
        let damaged = |reason: String| Error::Damaged { offset, reason };
        let counted = (
            self.tally.records,
            self.tally.principals,
            self.tally.warning_tasks,
        );
        if (t.records, t.principals, t.warning_tasks) != counted {
            return Err(damaged(format!(
                "the trailer counts {} records, {} principals, {} warning tasks; the file holds {}, {}, {}",
                t.records, t.principals, t.warning_tasks, counted.0, counted.1, counted.2
            )));
        }
        if t.max_fence != self.tally.max_fence {
            return Err(damaged(format!(
                "the trailer's max_fence {} is not the highest fence held ({})",
                t.max_fence, self.tally.max_fence
            )));
        }
        let digest = hex::encode(before.finalize());
        if t.sha256 != digest {
            return Err(damaged(format!(
                "the trailer's digest {} is not the file's ({digest})",
                t.sha256
            )));
        }
        Ok(())
    }
}

/// SPEC §12 "What import trusts": a checksum proves the bytes arrived,
/// not that they are a store. Each entity is checked against the
/// invariants (§6), and across entities: no fence granted twice within a
/// tenant (attempts' fences; quarantined evidence carries whatever fence a
/// caller sent), no record's generation above its principal's.
#[derive(Default)]
struct Trust {
    /// The tenant whose records are being read (records come sorted by
    /// tenant), and the attempt fences seen in it.
    tenant: Option<TenantId>,
    fences: HashSet<u64>,
    /// Per (tenant, principal): the highest generation a record holds, and
    /// where that record's line starts, until the principal's line is read.
    generations: HashMap<(TenantId, Principal), (u64, u64, String)>,
}

impl Trust {
    fn entity(&mut self, e: &Entity, offset: u64) -> Result<(), String> {
        match e {
            Entity::Record { tenant, record } => {
                settle_core::check_record(record).map_err(|v| {
                    format!("record {tenant}/{} breaks an invariant: {v}", record.key)
                })?;
                if self.tenant.as_ref() != Some(tenant) {
                    self.tenant = Some(tenant.clone());
                    self.fences.clear();
                }
                for a in &record.attempts {
                    if !self.fences.insert(a.lease.fence.0) {
                        return Err(format!(
                            "record {tenant}/{} holds fence {}, granted to another record of \
                             the tenant: no fence is granted twice",
                            record.key, a.lease.fence.0
                        ));
                    }
                }
                let g = record.reservation.generation;
                if g > 0 {
                    let e = self
                        .generations
                        .entry((tenant.clone(), record.reservation.principal.clone()))
                        .or_insert((0, offset, String::new()));
                    if g > e.0 {
                        *e = (g, offset, record.key.to_string());
                    }
                }
            }
            Entity::Principal {
                tenant,
                principal,
                state,
            } => {
                settle_core::check_principal(state)
                    .map_err(|v| format!("principal {tenant}/{principal} is not valid: {v}"))?;
                if let Some((g, _, key)) = self
                    .generations
                    .remove(&(tenant.clone(), principal.clone()))
                    && g > state.generation
                {
                    return Err(format!(
                        "record {tenant}/{key} holds generation {g} of principal {principal}, \
                         whose generation is {}",
                        state.generation
                    ));
                }
            }
            Entity::Warnings { .. } => {}
        }
        Ok(())
    }

    /// At the trailer: a record's principal with no line is at generation 0.
    fn end(&mut self) -> Result<(), (u64, String)> {
        let first = self
            .generations
            .iter()
            .min_by_key(|(_, (_, offset, _))| *offset);
        if let Some(((tenant, principal), (g, offset, key))) = first {
            return Err((
                *offset,
                format!(
                    "record {tenant}/{key} holds generation {g} of principal {principal}, \
                     which the file has no line for (generation 0)"
                ),
            ));
        }
        Ok(())
    }
}

impl<R: BufRead> Iterator for Reader<R> {
    type Item = Result<Entity, Error>;

    fn next(&mut self) -> Option<Result<Entity, Error>> {
        self.next_entity().transpose()
    }
}

/// Reads a whole file and checks it; its summary if it is whole.
pub fn verify(inp: impl BufRead) -> Result<Summary, Error> {
    let mut r = Reader::new(inp)?;
    while r.next_entity()?.is_some() {}
    Ok(r.summary.take().expect("read to the trailer"))
}

#[cfg(test)]
mod tests;
