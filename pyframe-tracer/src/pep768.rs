//! PLACEHOLDER (being written): PEP 768.
use crate::memory::RemoteMemory;
#[derive(Debug)]
pub struct Pep768Error(String);
impl std::fmt::Display for Pep768Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for Pep768Error {}
pub fn request_script(
    _mem: &impl RemoteMemory,
    _runtime_addr: u64,
    _script_path: &str,
) -> Result<u64, Pep768Error> {
    Err(Pep768Error("todo".into()))
}
pub fn cancel(
    _mem: &impl RemoteMemory,
    _runtime_addr: u64,
    _tstate: u64,
) -> Result<bool, Pep768Error> {
    Ok(false)
}
