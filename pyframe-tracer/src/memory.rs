//! Reading and writing another process's memory with `process_vm_readv` / `process_vm_writev`.

use std::io;
use std::io::{IoSlice, IoSliceMut};

use nix::sys::uio::{process_vm_readv, process_vm_writev, RemoteIoVec};
use nix::unistd::Pid;

/// Byte-level access to an address space. Implemented for live processes ([`ProcessMemory`]) and, in
/// tests, for plain buffers, so layout-walking code can be tested without a target.
pub trait RemoteMemory {
    /// Fills `buf` from `addr`; fails if any byte cannot be read.
    fn read(&self, addr: u64, buf: &mut [u8]) -> io::Result<()>;
    /// Writes `data` at `addr`; fails if any byte cannot be written.
    fn write(&self, addr: u64, data: &[u8]) -> io::Result<()>;

    /// Reads a little-endian u64.
    fn read_u64(&self, addr: u64) -> io::Result<u64> {
        let mut b = [0u8; 8];
        self.read(addr, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    /// Reads a little-endian u32.
    fn read_u32(&self, addr: u64) -> io::Result<u32> {
        let mut b = [0u8; 4];
        self.read(addr, &mut b)?;
        Ok(u32::from_le_bytes(b))
    }
}

/// The memory of a live process (needs ptrace access rights to it, as for `/proc/PID/mem`).
#[derive(Debug, Clone, Copy)]
pub struct ProcessMemory {
    pid: Pid,
}

impl ProcessMemory {
    /// Memory of process `pid`.
    pub fn new(pid: i32) -> Self {
        Self {
            pid: Pid::from_raw(pid),
        }
    }
}

impl RemoteMemory for ProcessMemory {
    fn read(&self, addr: u64, buf: &mut [u8]) -> io::Result<()> {
        let len = buf.len();
        let n = process_vm_readv(
            self.pid,
            &mut [IoSliceMut::new(buf)],
            &[RemoteIoVec {
                base: addr as usize,
                len,
            }],
        )
        .map_err(io::Error::from)?;
        if n != len {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("short read at {addr:#x}"),
            ));
        }
        Ok(())
    }

    fn write(&self, addr: u64, data: &[u8]) -> io::Result<()> {
        let n = process_vm_writev(
            self.pid,
            &[IoSlice::new(data)],
            &[RemoteIoVec {
                base: addr as usize,
                len: data.len(),
            }],
        )
        .map_err(io::Error::from)?;
        if n != data.len() {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("short write at {addr:#x}"),
            ));
        }
        Ok(())
    }
}

/// A buffer mapped at a base address: the test double for [`RemoteMemory`].
#[derive(Debug, Default)]
pub struct BufferMemory {
    /// Address of `bytes[0]`.
    pub base: u64,
    /// The contents; writes go through a `RefCell`.
    pub bytes: std::cell::RefCell<Vec<u8>>,
}

impl BufferMemory {
    fn range(&self, addr: u64, len: usize) -> io::Result<std::ops::Range<usize>> {
        let start = addr.checked_sub(self.base).map(|o| o as usize);
        match start {
            Some(s) if s + len <= self.bytes.borrow().len() => Ok(s..s + len),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{addr:#x}+{len} out of range"),
            )),
        }
    }
}

impl RemoteMemory for BufferMemory {
    fn read(&self, addr: u64, buf: &mut [u8]) -> io::Result<()> {
        let r = self.range(addr, buf.len())?;
        buf.copy_from_slice(&self.bytes.borrow()[r]);
        Ok(())
    }

    fn write(&self, addr: u64, data: &[u8]) -> io::Result<()> {
        let r = self.range(addr, data.len())?;
        self.bytes.borrow_mut()[r].copy_from_slice(data);
        Ok(())
    }
}
