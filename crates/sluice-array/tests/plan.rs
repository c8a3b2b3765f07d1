//! The planner's properties: every element of the array is moved exactly
//! once, and each piece maps memory to disk element by element as the
//! distribution and the layout (through their independent inverses) say.

use proptest::prelude::*;
use sluice_array::{plan, ravel, unravel, Dist, Distribution, Dtype, ErrorKind, Layout, PlanLimits};

/// Check a plan against the closed forms: returns how many times each
/// element was covered.
fn check(dist: &Distribution, layout: &Layout) -> Vec<u32> {
    let p = plan(dist, layout, &PlanLimits::default()).unwrap();
    let el = layout.dtype().bytes();
    let total: u64 = layout.shape().iter().product();
    let mut covered = vec![0u32; total as usize];
    for piece in p.pieces() {
        assert!(piece.len > 0 && piece.len % el == 0, "{piece:?}");
        assert_eq!(piece.mem_off % el, 0);
        for e in 0..piece.len / el {
            let g = layout.element_at(piece.unit, piece.file_off + e * el).expect("a piece's byte is an element");
            let (rank, local) = dist.owner(&g);
            assert_eq!(rank, piece.rank, "element {g:?} is held by rank {rank}, not {}", piece.rank);
            assert_eq!(local * el, piece.mem_off + e * el, "element {g:?} at the wrong memory offset");
            assert_eq!(layout.locate(&g), (piece.unit, piece.file_off + e * el));
            covered[ravel(&g, layout.shape()) as usize] += 1;
        }
    }
    assert_eq!(p.bytes(), total * el);
    for r in 0..dist.ranks() {
        let mem: u64 = p.rank(r).map(|q| q.len).sum();
        assert_eq!(mem, dist.local_elements(r) * el, "rank {r} moves its whole local array");
    }
    covered
}

fn arb_case() -> impl Strategy<Value = (Distribution, Layout)> {
    (1usize..=3)
        .prop_flat_map(|n| {
            (
                prop::collection::vec(1u64..=11, n),
                prop::collection::vec(1u64..=3, n),
                prop::collection::vec(0u8..5, n),
                prop::collection::vec(1u64..=5, n),
                prop::collection::vec(1u64..=3, n),
                any::<bool>(),
                prop::sample::select(vec![Dtype::U8, Dtype::I16, Dtype::F32, Dtype::F64]),
            )
        })
        .prop_map(|(shape, grid, kinds, chunk, mult, sharded, dtype)| {
            let n = shape.len();
            let dists: Vec<Dist> = kinds
                .iter()
                .enumerate()
                .map(|(d, k)| match k {
                    0 => Dist::Block,
                    1 => Dist::Cyclic(1),
                    2 => Dist::Cyclic(2),
                    // Uneven: the first process holds most, some may hold
                    // none (sizes from the extent, deterministic per case).
                    3 => {
                        let p = grid[d] as usize;
                        let mut b = vec![0u64; p];
                        let mut left = shape[d];
                        for (c, x) in b.iter_mut().enumerate() {
                            *x = if c + 1 == p { left } else { (left * 2 / 3).min(left) };
                            left -= *x;
                        }
                        Dist::GenBlock(b)
                    }
                    _ => Dist::Star,
                })
                .collect();
            let grid: Vec<u64> = (0..n).map(|d| if dists[d] == Dist::Star { 1 } else { grid[d] }).collect();
            let chunk: Vec<u64> = (0..n).map(|d| chunk[d].min(shape[d])).collect();
            let shard = sharded.then(|| chunk.iter().zip(&mult).map(|(c, m)| c * m).collect());
            (Distribution::new(shape.clone(), grid, dists).unwrap(), Layout::new(shape, dtype, chunk, shard).unwrap())
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, .. ProptestConfig::default() })]

    #[test]
    fn every_element_moves_exactly_once((dist, layout) in arb_case()) {
        let covered = check(&dist, &layout);
        prop_assert!(covered.iter().all(|&c| c == 1), "coverage {covered:?}");
    }

    #[test]
    fn owner_and_intervals_agree((dist, _layout) in arb_case()) {
        // Distribution::owner (closed forms) and Distribution::intervals
        // (what the planner walks) are two codes for one rule.
        let total: u64 = dist.shape().iter().product();
        for i in 0..total {
            let g = unravel(i, dist.shape());
            let (r, _) = dist.owner(&g);
            let c = dist.coords(r);
            for d in 0..g.len() {
                prop_assert!(dist.intervals(d, c[d]).iter().any(|&(lo, hi)| lo <= g[d] && g[d] < hi));
            }
        }
    }
}

#[test]
fn block_rows_are_joined_when_contiguous_in_both() {
    // 8 x 8 over 2 x 1 BLOCK, chunks of 4 x 8: each rank's 4 rows form one
    // whole chunk, so one piece each.
    let dist = Distribution::new(vec![8, 8], vec![2, 1], vec![Dist::Block, Dist::Star]).unwrap();
    let layout = Layout::new(vec![8, 8], Dtype::F64, vec![4, 8], None).unwrap();
    let p = plan(&dist, &layout, &PlanLimits::default()).unwrap();
    assert_eq!(p.pieces().len(), 2);
    assert_eq!(p.rank(1).next().unwrap().unit, 1);
}

#[test]
fn cyclic_hpf_local_index() {
    // CYCLIC(2) of 10 over 3: rank 1 holds 2,3 and 8,9, at local 0..4.
    let dist = Distribution::new(vec![10], vec![3], vec![Dist::Cyclic(2)]).unwrap();
    assert_eq!(dist.intervals(0, 1), vec![(2, 4), (8, 10)]);
    assert_eq!(dist.owner(&[8]), (1, 2));
    assert_eq!(dist.local_shape(1), vec![4]);
    assert_eq!(dist.local_shape(2), vec![2]);
}

#[test]
fn pieces_max_is_a_bound_at_n_and_n_plus_1() {
    // CYCLIC(1) of 16 over 2 ranks in chunks of 16: 16 single-element
    // pieces (no two neighbours are contiguous in memory and on disk).
    let dist = Distribution::new(vec![16], vec![2], vec![Dist::Cyclic(1)]).unwrap();
    let layout = Layout::new(vec![16], Dtype::U8, vec![16], None).unwrap();
    let at = plan(&dist, &layout, &PlanLimits { pieces_max: 16 }).unwrap();
    assert_eq!(at.pieces().len(), 16);
    let past = plan(&dist, &layout, &PlanLimits { pieces_max: 15 }).unwrap_err();
    assert_eq!(past.kind, ErrorKind::Limit);
    assert!(past.message.contains("pieces_max"), "{past}");
}

#[test]
fn bad_descriptions_are_refused_with_a_reason() {
    let e = Distribution::new(vec![4, 4], vec![2, 2], vec![Dist::Block, Dist::Star]).unwrap_err();
    assert!(e.message.contains("not distributed"), "{e}");
    let e = Layout::new(vec![4], Dtype::F64, vec![3], Some(vec![4])).unwrap_err();
    assert!(e.message.contains("multiple"), "{e}");
    let e = Layout::new(vec![1 << 20, 1 << 20], Dtype::U8, vec![1, 1], None).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Limit);
    assert!(Dist::parse("cyclic(0)").is_err());
    assert_eq!(Dist::parse("CYCLIC(4)").unwrap(), Dist::Cyclic(4));
    assert_eq!(Dist::parse("gen_block(6:0:2)").unwrap(), Dist::GenBlock(vec![6, 0, 2]));
    assert_eq!(Dist::parse("GEN_BLOCK(6, 0, 2)").unwrap().to_string(), "GEN_BLOCK(6:0:2)");
    assert!(Dist::parse("gen_block()").is_err() && Dist::parse("gen_block(1:x)").is_err());
    // GEN_BLOCK needs one size per process, summing to the extent.
    let e = Distribution::new(vec![8], vec![3], vec![Dist::GenBlock(vec![6, 2])]).unwrap_err();
    assert!(e.message.contains("GEN_BLOCK needs 3 sizes"), "{e}");
    assert!(Distribution::new(vec![8], vec![2], vec![Dist::GenBlock(vec![6, 3])]).is_err());
    let uneven = Distribution::new(vec![8, 2], vec![3, 1], vec![Dist::GenBlock(vec![6, 0, 2]), Dist::Star]).unwrap();
    assert_eq!((uneven.local_shape(0), uneven.local_shape(1), uneven.local_shape(2)), (vec![6, 2], vec![0, 2], vec![2, 2]));
    assert_eq!(uneven.owner(&[7, 1]), (2, 3));
    let dist = Distribution::new(vec![4], vec![1], vec![Dist::Star]).unwrap();
    let layout = Layout::new(vec![5], Dtype::U8, vec![5], None).unwrap();
    assert!(plan(&dist, &layout, &PlanLimits::default()).is_err());
}

#[test]
fn dims_max_is_a_bound_at_n_and_n_plus_1() {
    let n = sluice_array::DIMS_MAX;
    assert!(Layout::new(vec![1; n], Dtype::U8, vec![1; n], None).is_ok());
    let e = Layout::new(vec![1; n + 1], Dtype::U8, vec![1; n + 1], None).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Limit);
}

#[test]
fn shard_index_marks_inner_chunks_outside_the_array_missing() {
    // 6 elements, chunks of 2, shards of 4: shard 1 holds chunk 2 (4..6)
    // and chunk 3 (6..8, wholly outside).
    let l = Layout::new(vec![6], Dtype::U8, vec![2], Some(vec![4])).unwrap();
    assert_eq!(l.units(), 2);
    assert_eq!(l.index_bytes(), 2 * 16 + 4);
    let idx = l.shard_index(1);
    assert_eq!(&idx[0..8], &0u64.to_le_bytes());
    assert_eq!(&idx[8..16], &2u64.to_le_bytes());
    assert_eq!(&idx[16..32], &[0xff; 16]);
    assert_eq!(&idx[32..36], &crc32c::crc32c(&idx[..32]).to_le_bytes());
    assert_eq!(l.key(1), "c/1");
}

#[test]
fn a_shard_index_other_than_sluices_is_refused() {
    let l = Layout::new(vec![6], Dtype::U8, vec![2], Some(vec![4])).unwrap();
    let idx = l.shard_index(0);
    assert_eq!(l.check_shard_index(0, 8 + idx.len() as u64, &idx), Ok(()));
    let e = l.check_shard_index(0, 3, &idx[..3]).unwrap_err();
    assert!(e.contains("shorter than its shard index"), "{e}");
    // zarr-python's order: chunk 1 first.
    let mut other = idx.clone();
    other[0..8].copy_from_slice(&2u64.to_le_bytes());
    let e = l.check_shard_index(0, 8 + idx.len() as u64, &other).unwrap_err();
    assert!(e.contains("inner chunk 0") && e.contains("another Zarr writer"), "{e}");
    let plain = Layout::new(vec![6], Dtype::U8, vec![2], None).unwrap();
    assert_eq!(plain.check_shard_index(0, 2, &[]), Ok(()), "nothing to check without shards");
}

#[test]
fn zarr_json_round_trips_through_from_zarr_json() {
    for shard in [None, Some(vec![4, 6])] {
        let l = Layout::new(vec![7, 6], Dtype::F32, vec![2, 3], shard).unwrap();
        let v = l.zarr_json(&["y".into(), "x".into()], serde_json::json!({}));
        assert_eq!(Layout::from_zarr_json(&v).unwrap(), l);
    }
    let mut v = Layout::new(vec![4], Dtype::F64, vec![2], None).unwrap().zarr_json(&["x".into()], serde_json::json!({}));
    v["codecs"] = serde_json::json!([{"name": "bytes"}, {"name": "zstd"}]);
    assert!(Layout::from_zarr_json(&v).unwrap_err().message.contains("compressed"));
}

#[test]
fn messages_hold_at_most_pieces_max_and_bytes_max() {
    use sluice_array::{messages, MessageLimits, Piece};
    let p = |i: u64, len: u64| Piece { unit: 0, file_off: i * 100, rank: 0, mem_off: i * 100, len };
    let four: Vec<Piece> = (0..4).map(|i| p(i, 10)).collect();
    // N pieces fit one message; N + 1 take two.
    assert_eq!(messages(&four, &MessageLimits { pieces_max: 4, bytes_max: 1000 }).len(), 1);
    assert_eq!(messages(&four, &MessageLimits { pieces_max: 3, bytes_max: 1000 }).len(), 2);
    // N bytes fit one message; a piece past it is cut, its halves contiguous.
    assert_eq!(messages(&four, &MessageLimits { pieces_max: 10, bytes_max: 40 }).len(), 1);
    let cut = messages(&[p(0, 41)], &MessageLimits { pieces_max: 10, bytes_max: 40 });
    assert_eq!(cut.len(), 2);
    assert_eq!((cut[1][0].file_off, cut[1][0].mem_off, cut[1][0].len), (40, 40, 1));
}
