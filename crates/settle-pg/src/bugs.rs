//! Deliberate bugs for the black-box fault harness (docs/reliability.md):
//! compiled only with the `deliberate-bugs` feature (never in a release or
//! the package), switched on by `SETTLE_DELIBERATE_BUG`. They exist to show
//! that `settle-nemesis` catches what they break.

use std::future::Future;

/// The COMMIT of a write transaction, awaited. With the deliberate bug
/// `answer-before-commit`, a COMMIT still waiting after 20 ms (a
/// synchronous standby that does not answer) is taken as done and the
/// command is answered while the COMMIT is still in flight.
pub(crate) async fn commit<F>(commit: F) -> Result<(), tokio_postgres::Error>
where
    F: Future<Output = Result<(), tokio_postgres::Error>>,
{
    #[cfg(feature = "deliberate-bugs")]
    if enabled::answer_before_commit() {
        let wait = std::time::Duration::from_millis(20);
        return tokio::time::timeout(wait, commit).await.unwrap_or(Ok(()));
    }
    commit.await
}

#[cfg(feature = "deliberate-bugs")]
mod enabled {
    use std::sync::OnceLock;

    pub(super) fn answer_before_commit() -> bool {
        static ON: OnceLock<bool> = OnceLock::new();
        *ON.get_or_init(|| {
            let on =
                std::env::var("SETTLE_DELIBERATE_BUG").is_ok_and(|v| v == "answer-before-commit");
            if on {
                tracing::warn!(
                    "DELIBERATE BUG answer-before-commit is on: answers may precede their COMMIT"
                );
            }
            on
        })
    }
}
