//! Page-cache residency of a file, measured with `mmap` + `mincore(2)`.
//!
//! This is the crate's one module with unsafe code: Rust's safe wrappers do
//! not offer `mincore`. The mapping is read-only, never read through (so it
//! faults nothing in), and unmapped before returning.
#![expect(unsafe_code, reason = "mmap + mincore to measure page-cache residency")]

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

/// `(bytes of the file in the page cache, file size)`, page granular.
pub fn resident_bytes(file: &File) -> io::Result<(u64, u64)> {
    let size = file.metadata()?.len();
    if size == 0 {
        return Ok((0, 0));
    }
    let len = usize::try_from(size).map_err(|_| io::Error::other("file too large to map"))?;
    // SAFETY: sysconf has no memory-safety preconditions.
    let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
    // SAFETY: a new shared read-only mapping of an open file, at an address
    // the kernel chooses; it aliases no Rust object.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    let mut vec = vec![0u8; len.div_ceil(page)];
    // SAFETY: `ptr..ptr+len` is the mapping made above; `vec` has one byte
    // per page of it, as mincore requires.
    let rc = unsafe { libc::mincore(ptr, len, vec.as_mut_ptr()) };
    let err = io::Error::last_os_error();
    // SAFETY: unmaps exactly the mapping made above; nothing refers to it.
    unsafe { libc::munmap(ptr, len) };
    if rc != 0 {
        return Err(err);
    }
    let pages = vec.iter().filter(|v| *v & 1 == 1).count() as u64;
    Ok(((pages * page as u64).min(size), size))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    #[test]
    fn reading_a_file_makes_it_resident_and_dontneed_drops_it() {
        let dir = std::env::temp_dir().join(format!("keel-resident-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("f");
        let mut f = File::create(&path).unwrap();
        f.write_all(&vec![1u8; 1 << 20]).unwrap();
        f.sync_all().unwrap();
        let mut f = File::open(&path).unwrap();
        let mut buf = Vec::new();
        f.read_to_end(&mut buf).unwrap();
        let (resident, size) = resident_bytes(&f).unwrap();
        assert_eq!(size, 1 << 20);
        assert!(resident > size / 2, "{resident} of {size} resident after reading");
        rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed).unwrap();
        let (resident, _) = resident_bytes(&f).unwrap();
        assert!(
            resident < size / 10,
            "{resident} of {size} resident after DONTNEED"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
