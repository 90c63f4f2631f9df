//! A tiny harness over the pure [`World`]: a manual clock, a tenant, builders.
#![allow(dead_code)]

pub use settle_core::testkit::*;
use settle_core::*;

pub const T0: u64 = 1_700_000_000_000;

pub struct H {
    pub w: World,
    pub now: u64,
    pub tenant: TenantId,
}

impl H {
    pub fn new() -> H {
        H {
            w: World::default(),
            now: T0,
            tenant: TenantId::default_tenant(),
        }
    }
    pub fn run(&mut self, cmd: Command) -> Reply {
        self.w
            .execute(&self.tenant, &cmd, Timestamp(self.now))
            .reply
    }
    pub fn advance(&mut self, ms: u64) {
        self.now += ms;
    }
    pub fn rec(&self, k: &str) -> Record {
        self.w
            .records
            .get(&(self.tenant.clone(), key(k)))
            .cloned()
            .expect("record exists")
    }
    pub fn get(&self, k: &str) -> Result<Option<Record>, RefusalCode> {
        self.w.get(&self.tenant, &key(k), Timestamp(self.now))
    }
    /// Claims and expects `execute`; returns the fence.
    pub fn exec(&mut self, cmd: Command) -> Fence {
        match self.run(cmd) {
            Reply::Claim(ClaimDecision::Execute(g)) => g.fence,
            other => panic!("expected execute, got {other:?}"),
        }
    }
}
