//! Field offsets of kernel structures, read from the kernel's BTF at load time so the
//! probes work across kernel builds (a hand-rolled CO-RE for the few fields we need).

use std::path::Path;

use anyhow::{bail, Context, Result};
use btf_rs::{Btf, Type};

/// Offsets inside `struct task_struct` and `struct pt_regs`.
#[derive(Debug, Clone, Copy)]
pub struct TaskOffsets {
    /// Byte offset of `pid` (the thread id).
    pub pid: u32,
    /// Byte offset of `tgid` (the process id).
    pub tgid: u32,
    /// Byte offset of the syscall number in `struct pt_regs` (`orig_ax` on x86-64,
    /// `syscallno` on arm64), if the BTF has it.
    pub regs_nr: Option<u32>,
}

impl TaskOffsets {
    /// Reads the offsets from the BTF file at `path`.
    pub fn from_btf(path: &Path) -> Result<Self> {
        let btf = Btf::from_file(path)
            .with_context(|| format!("cannot parse kernel BTF {}", path.display()))?;
        let task = btf
            .resolve_types_by_name("task_struct")
            .context("kernel BTF has no struct task_struct")?
            .into_iter()
            .find_map(|t| match t {
                Type::Struct(s) => Some(s),
                _ => None,
            })
            .context("kernel BTF has no struct task_struct")?;
        let find = |name: &str| -> Result<u32> {
            member_offset(&btf, &task, name)?
                .with_context(|| format!("struct task_struct has no field {name} in kernel BTF"))
        };
        let regs_nr = btf
            .resolve_types_by_name("pt_regs")
            .ok()
            .into_iter()
            .flatten()
            .find_map(|t| match t {
                Type::Struct(s) => Some(s),
                _ => None,
            })
            .and_then(|regs| {
                ["orig_ax", "syscallno"]
                    .iter()
                    .find_map(|name| member_offset(&btf, &regs, name).ok().flatten())
            });
        Ok(Self {
            pid: find("pid")?,
            tgid: find("tgid")?,
            regs_nr,
        })
    }
}

/// Byte offset of `name` in `s`, looking through anonymous struct/union members.
fn member_offset(btf: &Btf, s: &btf_rs::Struct, name: &str) -> Result<Option<u32>> {
    for m in &s.members {
        let member_name = btf.resolve_name(m).unwrap_or_default();
        if member_name == name {
            if m.bit_offset() % 8 != 0 {
                bail!("field {name} is a bitfield");
            }
            return Ok(Some(m.bit_offset() / 8));
        }
        if member_name.is_empty() {
            if let Ok(Type::Struct(inner) | Type::Union(inner)) = btf.resolve_chained_type(m) {
                if let Some(off) = member_offset(btf, &inner, name)? {
                    return Ok(Some(m.bit_offset() / 8 + off));
                }
            }
        }
    }
    Ok(None)
}
