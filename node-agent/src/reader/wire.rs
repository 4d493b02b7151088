//! The reader's messages, in a small binary form of our own.
//!
//! Hand-made rather than serde with a binary codec: a reply comes from a process that has
//! just parsed a tenant's file and must be treated as hostile too. Every count here is
//! checked against the bytes left in the message before anything is allocated, so a
//! decoded reply never costs more than the (bounded) message it came from.

/// Writes little-endian fields into a message.
#[derive(Default)]
pub struct Enc(pub Vec<u8>);

impl Enc {
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// A length (u32) and the bytes.
    pub fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.u32(u32::try_from(v.len()).unwrap_or(u32::MAX));
        let n = v.len().min(u32::MAX as usize);
        self.0.extend_from_slice(&v[..n]);
        self
    }
}

/// The message was shorter than its fields, or a count asked for more than it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a malformed reader message")]
pub struct Malformed;

/// Reads fields back, every one checked against what is left.
pub struct Dec<'a>(pub &'a [u8]);

impl<'a> Dec<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Malformed> {
        if n > self.0.len() {
            return Err(Malformed);
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    pub fn u8(&mut self) -> Result<u8, Malformed> {
        Ok(self.take(1)?[0])
    }
    pub fn u32(&mut self) -> Result<u32, Malformed> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().map_err(|_| Malformed)?,
        ))
    }
    pub fn u64(&mut self) -> Result<u64, Malformed> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().map_err(|_| Malformed)?,
        ))
    }
    pub fn bytes(&mut self) -> Result<&'a [u8], Malformed> {
        let n = self.u32()? as usize;
        self.take(n)
    }
    /// A count of items each at least `min_size` bytes long, refused when the message
    /// cannot hold that many (so a `Vec::with_capacity(count)` costs at most the message).
    pub fn count(&mut self, min_size: usize) -> Result<usize, Malformed> {
        let n = self.u32()? as usize;
        if n.saturating_mul(min_size.max(1)) > self.0.len() {
            return Err(Malformed);
        }
        Ok(n)
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Runs `f` with a message of one byte (`byte`, a request's kind) and room for one
/// descriptor (SCM_RIGHTS): what the agent sends and the reader receives.
pub(crate) fn with_fd_message<T>(byte: &mut [u8; 1], f: impl FnOnce(&mut libc::msghdr) -> T) -> T {
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    // SAFETY: CMSG_SPACE is a pure computation.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<i32>() as u32) } as usize;
    let mut control = vec![0u8; space];
    // SAFETY: msghdr is plain data; zeroed then filled.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // `iov` and `control` live until `f` returns.
    f(&mut msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_past_the_message_are_refused_before_allocating() {
        let mut e = Enc::default();
        e.u32(3).u64(1).u64(2).u64(3).bytes(b"abc");
        let mut d = Dec(&e.0);
        assert_eq!(d.count(8), Ok(3));
        for v in 1..=3 {
            assert_eq!(d.u64(), Ok(v));
        }
        assert_eq!(d.bytes(), Ok(&b"abc"[..]));
        assert!(d.is_empty());
        // A count of 2^32-1 items in a 4-byte message.
        let mut d = Dec(&[0xff, 0xff, 0xff, 0xff]);
        assert_eq!(d.count(1), Err(Malformed));
        let mut d = Dec(&[5, 0, 0, 0, b'a']);
        assert_eq!(d.bytes(), Err(Malformed));
        assert_eq!(Dec(&[1, 2]).u32(), Err(Malformed));
    }
}
