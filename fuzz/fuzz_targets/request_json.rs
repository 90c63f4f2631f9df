//! JSON request bodies into commands (settle-api `into_claim`, … for each
//! request type of SPEC §7), read as the server reads them
//! (settle-server `wire::parse_body`).
//!
//! Input: a selector byte (which call), then the body's bytes.
//!
//! Properties: no body panics; a refused body is 400 or 422, never a
//! server error; a body that converts yields a command the core's
//! validation accepts, whose request body (what a client sends for it)
//! parses back to the same command.
#![no_main]

use libfuzzer_sys::fuzz_target;
use settle_api as api;
use settle_core::{Command, InvalidInput, Key, RetentionS, TaskId, WarningClass};
use settle_server::problem::Problem;
use settle_server::wire::parse_body;

fuzz_target!(|data: &[u8]| {
    let Some((&which, body)) = data.split_first() else {
        return;
    };
    match command(which, body) {
        Ok(Ok(cmd)) => settle_fuzz::check_command(&cmd),
        // The route answers 422 naming the field.
        Ok(Err(e)) => assert!(!e.field.is_empty() || !e.reason.is_empty()),
        Err(p) => settle_fuzz::check_refusal(&p),
    }
});

fn command(which: u8, body: &[u8]) -> Result<Result<Command, InvalidInput>, Problem> {
    let key = Key::new("order-1").unwrap();
    Ok(match which % 7 {
        0 => parse_body::<api::ClaimRequest>(body)?
            .into_claim(key, RetentionS::DEFAULT)
            .map(Command::Claim),
        1 => parse_body::<api::HeartbeatRequest>(body)?
            .into_heartbeat(key)
            .map(Command::Heartbeat),
        2 => parse_body::<api::DispatchRequest>(body)?
            .into_dispatch(key)
            .map(Command::Dispatch),
        3 => parse_body::<api::SettleRequest>(body)?
            .into_settle(key)
            .map(Command::Settle),
        4 => parse_body::<api::ReleaseRequest>(body)?
            .into_release(key)
            .map(Command::Release),
        5 => parse_body::<api::ReconcileRequest>(body)?
            .into_reconcile(key)
            .map(Command::Reconcile),
        _ => parse_body::<api::WarnRequest>(body)?
            .into_warn(
                TaskId::new("task-1").unwrap(),
                WarningClass::new("class-1").unwrap(),
            )
            .map(Command::Warn),
    })
}
