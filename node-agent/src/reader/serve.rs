//! The reader process's side: confined first, then one request at a time from the
//! stream on its standard input (a one-byte kind carrying a descriptor), each answered
//! with a length, a status and the parsed data.

use std::{
    fs::File,
    os::{
        fd::{FromRawFd, OwnedFd},
        unix::net::UnixStream,
    },
};

use super::write_answer;

/// The reader's data budget (`RLIMIT_DATA`: heap and private mappings): what one parse
/// may cost at most. The agent's caches of its answers are `MAX_TABLE_BYTES` and
/// `MAX_SYMBOL_BYTES` beside it; together with the engine they stay under the chart's
/// 192 MiB limit.
pub const DATA_BUDGET: u64 = 64 << 20;
/// Its address-space limit (`RLIMIT_AS`): the data budget, the binary, the stack.
pub const ADDRESS_BUDGET: u64 = 512 << 20;

/// Confines this process (the reader): limits, the OOM killer's first choice, no
/// capabilities, no new privileges, and the system-call filter. An error leaves it
/// unconfined: the caller exits rather than serve.
pub fn confine() -> Result<(), String> {
    let limit = |res, v: u64| {
        let r = libc::rlimit {
            rlim_cur: v,
            rlim_max: v,
        };
        // SAFETY: a valid rlimit struct.
        if unsafe { libc::setrlimit(res, &r) } != 0 {
            return Err(format!("setrlimit: {}", std::io::Error::last_os_error()));
        }
        Ok(())
    };
    limit(libc::RLIMIT_DATA, DATA_BUDGET)?;
    limit(libc::RLIMIT_AS, ADDRESS_BUDGET)?;
    limit(libc::RLIMIT_CORE, 0)?;
    limit(libc::RLIMIT_NOFILE, 16)?;
    // Raising one's own score needs no privilege.
    std::fs::write("/proc/self/oom_score_adj", "1000")
        .map_err(|e| format!("oom_score_adj: {e}"))?;
    // SAFETY: prctl with integer arguments.
    unsafe {
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            return Err(format!("no_new_privs: {}", std::io::Error::last_os_error()));
        }
        // Dies with the agent's loader thread that started it.
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
        libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
    }
    drop_capabilities()?;
    let (deny_open, allow) = filters().map_err(|e| format!("seccomp filter: {e}"))?;
    // The allow-list last: installing a filter calls prctl(2), which it forbids.
    seccompiler::apply_filter(&deny_open).map_err(|e| format!("seccomp: {e}"))?;
    seccompiler::apply_filter(&allow).map_err(|e| format!("seccomp: {e}"))?;
    Ok(())
}

/// Every capability dropped: effective, permitted and inheritable, and the ambient set.
fn drop_capabilities() -> Result<(), String> {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    // SAFETY: prctl with integer arguments.
    unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        )
    };
    let header = Header {
        version: 0x2008_0522, // _LINUX_CAPABILITY_VERSION_3
        pid: 0,
    };
    let data = [Data {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: the v3 header and its two data words, as capset(2) takes them.
    if unsafe { libc::syscall(libc::SYS_capset, &header, data.as_ptr()) } != 0 {
        return Err(format!("capset: {}", std::io::Error::last_os_error()));
    }
    Ok(())
}

/// The system calls the reader makes: reading and writing what it holds, memory, time,
/// signals for a panic's unwinding, exiting. Anything else kills it (SIGSYS): it cannot
/// make a socket, exec, ptrace or signal another process. Opening a file fails with
/// EACCES rather than killing it (the second filter; the kernel takes the stricter of
/// the two answers): glibc's allocator reads /proc/sys/vm/overcommit_memory when it
/// shrinks a heap, and goes on without it.
fn filters() -> Result<(seccompiler::BpfProgram, seccompiler::BpfProgram), seccompiler::BackendError>
{
    use seccompiler::{SeccompAction, SeccompFilter, TargetArch};
    #[cfg(target_arch = "x86_64")]
    let arch = TargetArch::x86_64;
    #[cfg(target_arch = "aarch64")]
    let arch = TargetArch::aarch64;
    let opens = [
        #[cfg(target_arch = "x86_64")]
        libc::SYS_open,
        libc::SYS_openat,
        libc::SYS_openat2,
    ];
    let deny_open = SeccompFilter::new(
        opens.iter().map(|&s| (s, Vec::new())).collect(),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EACCES as u32),
        arch,
    )?
    .try_into()?;
    let allowed = [
        libc::SYS_read,
        libc::SYS_readv,
        libc::SYS_pread64,
        libc::SYS_write,
        libc::SYS_writev,
        libc::SYS_recvmsg,
        libc::SYS_sendmsg,
        libc::SYS_sendto,
        libc::SYS_recvfrom,
        libc::SYS_close,
        libc::SYS_fstat,
        libc::SYS_newfstatat,
        libc::SYS_statx,
        libc::SYS_lseek,
        libc::SYS_fcntl,
        libc::SYS_brk,
        libc::SYS_mmap,
        libc::SYS_munmap,
        libc::SYS_mremap,
        libc::SYS_mprotect,
        libc::SYS_madvise,
        libc::SYS_futex,
        libc::SYS_sched_yield,
        libc::SYS_getrandom,
        libc::SYS_clock_gettime,
        libc::SYS_gettid,
        libc::SYS_getcwd,
        libc::SYS_getpid,
        libc::SYS_rt_sigaction,
        libc::SYS_rt_sigprocmask,
        libc::SYS_rt_sigreturn,
        libc::SYS_sigaltstack,
        libc::SYS_exit,
        libc::SYS_exit_group,
        // abort(3) raises SIGABRT at itself (an allocation over the budget).
        libc::SYS_tgkill,
        // Some libcs raise with tkill.
        libc::SYS_tkill,
    ];
    let rules = allowed
        .iter()
        .chain(&opens)
        .map(|&s| (s, Vec::new()))
        .collect();
    let allow = SeccompFilter::new(
        rules,
        SeccompAction::KillProcess,
        SeccompAction::Allow,
        arch,
    )?
    .try_into()?;
    Ok((deny_open, allow))
}

/// Receives one request: its kind and the descriptor it carries.
fn receive(sock: &UnixStream) -> std::io::Result<Option<(u8, Option<File>)>> {
    use std::os::fd::AsRawFd;
    let mut byte = [0u8; 1];
    super::wire::with_fd_message(&mut byte, |msg| {
        // SAFETY: the buffers live across the call (`with_fd_message`);
        // MSG_CMSG_CLOEXEC keeps received fds private.
        let n = unsafe { libc::recvmsg(sock.as_raw_fd(), msg, libc::MSG_CMSG_CLOEXEC) };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        if n == 0 {
            return Ok(None);
        }
        let mut file = None;
        // SAFETY: walking the control messages the kernel wrote into the message.
        unsafe {
            let mut cmsg = libc::CMSG_FIRSTHDR(msg);
            while !cmsg.is_null() {
                if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                    let fd = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<i32>());
                    file = Some(File::from(OwnedFd::from_raw_fd(fd)));
                }
                cmsg = libc::CMSG_NXTHDR(msg, cmsg);
            }
        }
        Ok(Some(file))
    })
    .map(|r| r.map(|file| (byte[0], file)))
}

/// The reader's life: confined, then serving the stream on standard input until it ends.
/// Returns the process's exit code.
pub fn serve() -> i32 {
    if let Err(e) = confine() {
        eprintln!("resourcewatch reader: cannot confine itself, not serving: {e}");
        return 70;
    }
    // A parser's panic is caught and answered; its message, about a tenant's file,
    // goes nowhere.
    std::panic::set_hook(Box::new(|_| {}));
    // SAFETY: fd 0 is the stream the agent gave us, owned by this process alone.
    let sock = unsafe { UnixStream::from_raw_fd(0) };
    loop {
        let (kind, file) = match receive(&sock) {
            Ok(Some(r)) => r,
            Ok(None) | Err(_) => return 0,
        };
        #[cfg(test)]
        super::test_request(kind);
        let answer = match (super::kind_of(kind), file) {
            (Some(kind), Some(file)) => {
                // A panic in a parser is that file's answer, not the reader's end.
                std::panic::catch_unwind(|| super::parse(kind, file)).unwrap_or(None)
            }
            _ => None,
        };
        let written = match answer {
            Some(body) => write_answer(&sock, 0, &body),
            None => write_answer(&sock, 1, &[]),
        };
        if written.is_err() {
            return 0;
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    /// The reader of this crate's unit-test binary: `reader_command` starts the binary
    /// again with this one test and RW_READER_SERVE set. Run otherwise, it does nothing.
    #[test]
    fn serve_when_asked() {
        if std::env::var_os("RW_READER_SERVE").is_some() {
            std::process::exit(super::serve());
        }
    }
}
