use rayon::prelude::*;
use std::time::Instant;
const CH: usize = 1 << 20;
fn decode(bytes: &[u8], out: &mut [f32]) {
    out.par_chunks_mut(CH).zip(bytes.par_chunks(CH * 2)).for_each(|(d, s)| {
        for (x, c) in d.iter_mut().zip(s.chunks_exact(2)) { *x = half::bf16::from_le_bytes([c[0], c[1]]).to_f32(); }
    });
}
fn huge_vec(n: usize) -> Vec<f32> {
    let mut v: Vec<f32> = Vec::with_capacity(n);
    unsafe {
        let p = v.as_mut_ptr() as usize;
        let start = (p + (1 << 21) - 1) & !((1 << 21) - 1);
        let end = (p + n * 4) & !((1 << 21) - 1);
        if end > start { libc::madvise(start as *mut _, end - start, libc::MADV_HUGEPAGE); }
        std::ptr::write_bytes(v.as_mut_ptr(), 0, 0);
        v.set_len(n);
    }
    v
}
fn main() {
    let path = "/tmp/loadexp/w.bin";
    let n: usize = 1 << 30; // values
    if std::fs::metadata(path).map(|m| m.len() as usize) .unwrap_or(0) != n * 2 {
        let buf: Vec<u8> = (0..n * 2).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(path, &buf).unwrap();
    }
    let mode = std::env::args().nth(1).unwrap();
    let f = std::fs::File::open(path).unwrap();
    let t0 = Instant::now();
    let m = if mode.contains("pop") { unsafe { memmap2::MmapOptions::new().populate().map(&f).unwrap() } } else { unsafe { memmap2::Mmap::map(&f).unwrap() } };
    let t1 = t0.elapsed().as_secs_f64();
    // tensors of 47M values, like gate_up
    let per = 47 << 20;
    let mut total = 0f64;
    let mut at = 0;
    while at < n {
        let k = per.min(n - at);
        let mut out = if mode.contains("huge") { huge_vec(k) } else { vec![0f32; k] };
        decode(&m[at * 2..(at + k) * 2], &mut out);
        total += out[k / 2] as f64;
        at += k;
    }
    println!("{mode}: map {:.3} s, total {:.3} s ({total})", t1, t0.elapsed().as_secs_f64());
}
