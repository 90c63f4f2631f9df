//! `settle_local._native`: the PyO3 face of [`settle_local::LocalLedger`].
//!
//! One class, `Ledger`, with `request(method, target, headers, body)`
//! answering `(status, headers, body)`; the Python package wraps it in an
//! httpx transport so that `settle_client`'s own `Client` and
//! `AsyncClient` run on it unchanged. Every call that may wait on the
//! store (open, request, close) releases the GIL.

use std::path::PathBuf;

use pyo3::exceptions::{PyOSError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use settle_local::{LocalError, LocalLedger};

fn to_py(e: LocalError) -> PyErr {
    match e {
        LocalError::Open { .. } => PyOSError::new_err(e.to_string()),
        LocalError::Invalid(_) => PyValueError::new_err(e.to_string()),
        LocalError::Closed | LocalError::Body(_) => PyRuntimeError::new_err(e.to_string()),
    }
}

/// `(status, headers, body)`.
type Answer<'py> = (u16, Vec<(String, String)>, Bound<'py, PyBytes>);

/// A settle server in this process (the in-memory store, or the embedded
/// engine when `data` names a directory).
#[pyclass(frozen, module = "settle_local._native")]
struct Ledger {
    inner: LocalLedger,
}

#[pymethods]
impl Ledger {
    #[new]
    #[pyo3(signature = (data=None))]
    fn new(py: Python<'_>, data: Option<PathBuf>) -> PyResult<Ledger> {
        let inner = py
            .detach(|| LocalLedger::open(data.as_deref()))
            .map_err(to_py)?;
        Ok(Ledger { inner })
    }

    /// Whether receipts survive the process.
    #[getter]
    fn durable(&self) -> bool {
        self.inner.durable()
    }

    /// One HTTP exchange: `target` is the path with its query.
    fn request<'py>(
        &self,
        py: Python<'py>,
        method: String,
        target: String,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
    ) -> PyResult<Answer<'py>> {
        let reply = py
            .detach(|| self.inner.call(&method, &target, &headers, body))
            .map_err(to_py)?;
        Ok((reply.status, reply.headers, PyBytes::new(py, &reply.body)))
    }

    /// Closes the store; later requests raise.
    fn close(&self, py: Python<'_>) {
        py.detach(|| self.inner.close());
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Ledger>()
}
