//! The few kernel calls aya 0.13 does not offer for these program types: creating a
//! `bpf_link` we own (so that it can be pinned and outlive the proxy), pinning and opening
//! it, pointing it at a new program, the netns cookie of a socket, and bpffs.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

const BPF_PROG_ATTACH: libc::c_long = 8;
const BPF_OBJ_PIN: libc::c_long = 6;
const BPF_OBJ_GET: libc::c_long = 7;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_LINK_UPDATE: libc::c_long = 29;

/// `bpf_attach_type` values used here.
pub const BPF_CGROUP_SOCK_OPS: u32 = 3;
/// `cgroup/connect4`.
pub const BPF_CGROUP_INET4_CONNECT: u32 = 10;
/// `cgroup/connect6`.
pub const BPF_CGROUP_INET6_CONNECT: u32 = 11;
/// `sk_lookup`.
pub const BPF_SK_LOOKUP: u32 = 36;
/// `sk_msg` on a sockmap or sockhash.
pub const BPF_SK_MSG_VERDICT: u32 = 7;

/// `SO_NETNS_COOKIE` (Linux 5.14).
const SO_NETNS_COOKIE: libc::c_int = 71;
/// `BPF_FS_MAGIC`.
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

/// A zeroed `union bpf_attr`, large enough for every command used here; the kernel wants
/// the bytes past the fields it reads to be zero.
#[repr(C, align(8))]
struct Attr([u32; 32]);

fn bpf(cmd: libc::c_long, attr: &mut Attr) -> io::Result<libc::c_long> {
    // SAFETY: `attr` is a live, zero-padded bpf_attr of the size given.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut Attr,
            std::mem::size_of::<Attr>(),
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn owned(fd: libc::c_long) -> io::Result<OwnedFd> {
    let fd = i32::try_from(fd).map_err(|_| io::Error::other("bpf returned a bad fd"))?;
    // SAFETY: the kernel just returned this fd to us and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `BPF_LINK_CREATE`: attaches `prog` to `target` (a cgroup or netns fd).
pub fn link_create(
    prog: BorrowedFd<'_>,
    target: BorrowedFd<'_>,
    attach_type: u32,
) -> io::Result<OwnedFd> {
    let mut attr = Attr([0; 32]);
    attr.0[0] = prog.as_raw_fd() as u32;
    attr.0[1] = target.as_raw_fd() as u32;
    attr.0[2] = attach_type;
    owned(bpf(BPF_LINK_CREATE, &mut attr)?)
}

/// `BPF_PROG_ATTACH` of `prog` to a sockmap or sockhash (`target`): the program stays
/// with the map — pinned, it outlives the process — and a later attach replaces it.
pub fn prog_attach(
    prog: BorrowedFd<'_>,
    target: BorrowedFd<'_>,
    attach_type: u32,
) -> io::Result<()> {
    let mut attr = Attr([0; 32]);
    attr.0[0] = target.as_raw_fd() as u32;
    attr.0[1] = prog.as_raw_fd() as u32;
    attr.0[2] = attach_type;
    bpf(BPF_PROG_ATTACH, &mut attr).map(drop)
}

/// `BPF_LINK_UPDATE`: the link runs `prog` from now on.
pub fn link_update(link: BorrowedFd<'_>, prog: BorrowedFd<'_>) -> io::Result<()> {
    let mut attr = Attr([0; 32]);
    attr.0[0] = link.as_raw_fd() as u32;
    attr.0[1] = prog.as_raw_fd() as u32;
    bpf(BPF_LINK_UPDATE, &mut attr).map(drop)
}

fn path_attr(path: &Path, fd: u32) -> io::Result<(Attr, CString)> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::other(format!("{} contains a NUL byte", path.display())))?;
    let mut attr = Attr([0; 32]);
    let ptr = c.as_ptr() as u64;
    attr.0[0] = ptr as u32;
    attr.0[1] = (ptr >> 32) as u32;
    attr.0[2] = fd;
    Ok((attr, c))
}

/// `BPF_OBJ_PIN`: `fd` stays alive at `path` (on bpffs) after the process exits.
pub fn obj_pin(fd: BorrowedFd<'_>, path: &Path) -> io::Result<()> {
    let (mut attr, _keep) = path_attr(path, fd.as_raw_fd() as u32)?;
    bpf(BPF_OBJ_PIN, &mut attr).map(drop)
}

/// `BPF_OBJ_GET`: opens what is pinned at `path`.
pub fn obj_get(path: &Path) -> io::Result<OwnedFd> {
    let (mut attr, _keep) = path_attr(path, 0)?;
    owned(bpf(BPF_OBJ_GET, &mut attr)?)
}

/// The cookie of the network namespace `socket` belongs to — what
/// `bpf_get_netns_cookie` returns to the programs for sockets of that namespace.
pub fn netns_cookie(socket: BorrowedFd<'_>) -> io::Result<u64> {
    let mut cookie: u64 = 0;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: `cookie` and `len` are valid for writes of the sizes given.
    let r = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_NETNS_COOKIE,
            (&mut cookie as *mut u64).cast(),
            &mut len,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(cookie)
}

/// Whether `path` is on a bpffs.
pub fn is_bpffs(path: &Path) -> io::Result<bool> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::other(format!("{} contains a NUL byte", path.display())))?;
    // SAFETY: an all-zero statfs is a valid value to be overwritten.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid C string and `st` is valid for writes.
    let r = unsafe { libc::statfs(c.as_ptr(), &mut st) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st.f_type as i64 == BPF_FS_MAGIC)
}

/// Mounts a bpffs at `path` (as `mount -t bpf bpf <path>`).
pub fn mount_bpffs(path: &Path) -> io::Result<()> {
    let target = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::other(format!("{} contains a NUL byte", path.display())))?;
    let fstype = c"bpf";
    // SAFETY: every pointer is a valid C string; no data argument.
    let r = unsafe {
        libc::mount(
            fstype.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Returns freed heap memory to the system (`malloc_trim(0)`).
pub fn release_free_memory() {
    // SAFETY: malloc_trim only releases memory the allocator holds free.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Where the cgroup v2 hierarchy is mounted (`/sys/fs/cgroup` on a unified host,
/// `/sys/fs/cgroup/unified` on a hybrid one), from `/proc/mounts`.
pub fn cgroup2_mount() -> std::path::PathBuf {
    std::fs::read_to_string("/proc/mounts")
        .unwrap_or_default()
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.get(2) == Some(&"cgroup2"))
        .and_then(|f| f.get(1).map(std::path::PathBuf::from))
        .unwrap_or_else(|| std::path::PathBuf::from("/sys/fs/cgroup"))
}

/// This process's cgroup v2 id: the inode of its cgroup's directory in the cgroup2 mount
/// (what `bpf_get_current_cgroup_id` returns for its tasks).
pub fn own_cgroup_id() -> io::Result<u64> {
    use std::os::unix::fs::MetadataExt;
    let dir = own_cgroup_dir()?;
    std::fs::metadata(&dir)
        .map(|m| m.ino())
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", dir.display())))
}

/// This process's cgroup v2 directory, under a cgroup2 mount as this process sees it.
pub fn own_cgroup_dir() -> io::Result<std::path::PathBuf> {
    let cgroups = std::fs::read_to_string("/proc/self/cgroup")?;
    let path = cgroups
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                "no cgroup v2 line in /proc/self/cgroup",
            )
        })?;
    let mounts = std::fs::read_to_string("/proc/self/mountinfo")?;
    let candidates = cgroup_dirs(path, &mounts);
    candidates.iter().find(|d| d.is_dir()).cloned().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "cgroup {path} (/proc/self/cgroup) is under no cgroup2 mount of /proc/self/mountinfo \
                 (tried {candidates:?}): mount the host's cgroup2 hierarchy, or this process's part of it"
            ),
        )
    })
}

/// Where cgroup `path` (as `/proc/self/cgroup` has it) would be, under each cgroup2 mount
/// of `mountinfo` whose root holds it, in mount order. A container has its own cgroup2
/// mount and often the host's too (a hostPath): with a cgroup namespace of its own, its
/// cgroup is `/`, its own mount's root is `/`, and the host's mount's root reads `/..`
/// (outside the namespace), so only its own holds it; a bind of a part of the hierarchy
/// (root `/a/b`) holds only what is under `/a/b`.
fn cgroup_dirs(path: &str, mountinfo: &str) -> Vec<std::path::PathBuf> {
    use std::path::Path;
    mountinfo
        .lines()
        .filter_map(|l| l.split_once(" - "))
        .filter(|(_, fs)| fs.starts_with("cgroup2 "))
        .filter_map(|(fields, _)| {
            // `<id> <parent> <dev> <root> <mount point> …`
            let mut f = fields.split(' ');
            let (root, mount) = (f.nth(3)?, f.next()?);
            let relative = Path::new(path).strip_prefix(root).ok()?;
            Some(Path::new(mount).join(relative))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::cgroup_dirs;
    use std::path::PathBuf;

    fn line(root: &str, at: &str) -> String {
        format!("30 20 0:26 {root} {at} rw,nosuid - cgroup2 cgroup2 rw\n")
    }

    #[test]
    fn the_own_cgroup_is_found_under_the_mount_that_holds_it() {
        // The host's view: its hierarchy at /sys/fs/cgroup.
        let host = line("/", "/sys/fs/cgroup");
        assert_eq!(
            cgroup_dirs("/kubepods/pod1/c1", &host),
            [PathBuf::from("/sys/fs/cgroup/kubepods/pod1/c1")]
        );
        // A container with a cgroup namespace of its own and the host's hierarchy as a
        // hostPath listed first: only its own mount holds its cgroup.
        let private = line("/../../..", "/host/sys/fs/cgroup") + &line("/", "/sys/fs/cgroup");
        assert_eq!(
            cgroup_dirs("/", &private),
            [PathBuf::from("/sys/fs/cgroup")]
        );
        // A bind of part of the hierarchy: what is under it, and nothing else.
        let part = line("/node-b", "/host/sys/fs/cgroup");
        assert_eq!(
            cgroup_dirs("/node-b/libpod-1", &part),
            [PathBuf::from("/host/sys/fs/cgroup/libpod-1")]
        );
        assert!(cgroup_dirs("/libpod_parent/libpod-1", &part).is_empty());
        // Component-wise: /node-bb is not under /node-b.
        assert!(cgroup_dirs("/node-bb/x", &part).is_empty());
        // Not cgroup2 (a v1 hierarchy of a hybrid host).
        let v1 = "31 20 0:27 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n";
        assert!(cgroup_dirs("/x", v1).is_empty());
    }
}
