//! Resolving symbols of a live process: `/proc/PID/maps` for load addresses, the ELF symbol tables of the mapped
//! files (read through `/proc/PID/map_files`, so it works across mount namespaces) for offsets.

use std::collections::HashMap;

use object::{Object, ObjectSegment, ObjectSymbol};

use crate::maps::Mapping;

/// Symbols of one mapped ELF file, relocated to where the target mapped it.
#[derive(Debug)]
pub struct Module {
    /// Path as the target sees it.
    pub path: String,
    /// Load bias: runtime address = bias + symbol value.
    pub bias: u64,
    symbols: HashMap<String, u64>,
}

impl Module {
    /// Runtime address of `name`, if the file defines it.
    pub fn symbol(&self, name: &str) -> Option<u64> {
        self.symbols.get(name).map(|v| self.bias.wrapping_add(*v))
    }
}

/// Loads the symbols of the first mapping of `path_filter`-matching file in `pid`.
pub fn load_module(
    pid: i32,
    mappings: &[Mapping],
    path_filter: impl Fn(&Mapping) -> bool,
) -> std::io::Result<Option<Module>> {
    let Some(first) = mappings.iter().find(|m| path_filter(m)) else {
        return Ok(None);
    };
    // Mapped rather than read: libpython is ~30 MB, which a read left in the daemon's heap.
    let opened = std::fs::File::open(first.map_file(pid))
        .or_else(|_| std::fs::File::open(format!("/proc/{pid}/root{}", first.path)))?;
    // SAFETY: a read-only private mapping; the file is a loaded library or executable, which
    // is not written in place while a process maps it.
    let data = unsafe { memmap2::Mmap::map(&opened)? };
    let file = object::File::parse(&*data).map_err(|e| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{}: {e}", first.path),
        )
    })?;
    // The lowest mapping of the file corresponds to the segment with the lowest file offset.
    let base = mappings
        .iter()
        .filter(|m| m.path == first.path)
        .map(|m| m.start - m.offset)
        .min()
        .unwrap_or(first.start);
    let min_vaddr = file
        .segments()
        .map(|s| s.address() - s.file_range().0)
        .min()
        .unwrap_or(0);
    let bias = if file.kind() == object::ObjectKind::Dynamic {
        base.wrapping_sub(min_vaddr)
    } else {
        0
    };
    let mut symbols = HashMap::new();
    for sym in file.dynamic_symbols().chain(file.symbols()) {
        if sym.is_definition() && sym.address() != 0 {
            if let Ok(name) = sym.name() {
                symbols.entry(name.to_string()).or_insert(sym.address());
            }
        }
    }
    Ok(Some(Module {
        path: first.path.clone(),
        bias,
        symbols,
    }))
}
