//! The link settings an N-API addon needs on each platform.
fn main() {
    napi_build::setup();
}
