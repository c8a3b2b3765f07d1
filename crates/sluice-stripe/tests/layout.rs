//! Layout arithmetic: round trips, coverage of list I/O, grouping,
//! message cutting, the size rule, and every bound at N and N+1.

use proptest::prelude::*;
use sluice_stripe::*;

fn layout() -> impl Strategy<Value = Layout> {
    (1u64..=64, 1u32..=8, 0u32..8).prop_flat_map(|(units, servers, start)| {
        (Just(units * STRIPE_UNIT_BYTES), 1..=servers, Just(start % servers), Just(servers)).prop_map(|(sb, count, start, servers)| Layout::new(sb, count, start, servers).unwrap())
    })
}

/// Expand pieces to (file byte, object, object byte) triples via the layout.
fn bytes_of(ranges: &[(u64, u64)]) -> Vec<u64> {
    ranges.iter().flat_map(|&(o, l)| o..o + l).collect()
}

proptest! {
    #[test]
    fn offset_round_trips(l in layout(), offset in 0u64..(1 << 40)) {
        let loc = l.locate(offset);
        prop_assert!(loc.object < l.count);
        prop_assert_eq!(loc.server, l.server_of(loc.object));
        prop_assert_eq!(l.logical(loc.object, loc.object_offset), offset);
    }

    #[test]
    fn list_maps_to_exactly_the_same_bytes(l in layout(), ranges in prop::collection::vec((0u64..100_000, 0u64..20_000), 0..8)) {
        let pieces = l.map_list(&ranges).unwrap();
        let lists = group(&pieces);
        // Every byte of the request, in buffer order, via the grouped lists.
        let total: u64 = ranges.iter().map(|r| r.1).sum();
        let mut seen = vec![u64::MAX; total as usize];
        for list in &lists {
            prop_assert_eq!(list.server, l.server_of(list.object));
            for (&(oo, len), &buf) in list.pieces.iter().zip(&list.buf_offsets) {
                for i in 0..len {
                    prop_assert_eq!(seen[(buf + i) as usize], u64::MAX, "byte covered twice");
                    seen[(buf + i) as usize] = l.logical(list.object, oo + i);
                }
            }
        }
        prop_assert_eq!(seen, bytes_of(&ranges));
        // One list per object at most.
        let mut objects: Vec<u32> = lists.iter().map(|x| x.object).collect();
        objects.dedup();
        prop_assert_eq!(objects.len(), lists.len());
    }

    #[test]
    fn chunks_cover_the_list_within_bounds(l in layout(), off in 0u64..100_000, len in 0u64..50_000, pmax in 1usize..6, bmax in 1u64..5_000) {
        for list in group(&l.map_list(&[(off, len)]).unwrap()) {
            let chunks = chunk(&list, pmax, bmax);
            let mut flat = Vec::new();
            for c in &chunks {
                prop_assert!(c.pieces.len() <= pmax && c.bytes() <= bmax && !c.pieces.is_empty());
                for (&(o, n), &b) in c.pieces.iter().zip(&c.buf_offsets) {
                    flat.extend((0..n).map(|i| (o + i, b + i)));
                }
            }
            let want: Vec<_> = list.pieces.iter().zip(&list.buf_offsets).flat_map(|(&(o, n), &b)| (0..n).map(move |i| (o + i, b + i))).collect();
            prop_assert_eq!(flat, want);
        }
    }

    #[test]
    fn size_rule_round_trips(l in layout(), size in 0u64..1_000_000) {
        let sizes: Vec<u64> = (0..l.count).map(|k| object_size_for(&l, size, k)).collect();
        prop_assert_eq!(file_size(&l, &sizes), size);
        prop_assert_eq!(sizes.iter().sum::<u64>(), size);
    }

    #[test]
    fn size_is_max_written_end(l in layout(), writes in prop::collection::vec((0u64..200_000, 1u64..10_000), 1..6)) {
        // Writes from several clients: each object grows to its highest byte.
        let mut sizes = vec![0u64; l.count as usize];
        for p in l.map_list(&writes).unwrap() {
            let s = &mut sizes[p.object as usize];
            *s = (*s).max(p.object_offset + p.len);
        }
        let want = writes.iter().map(|w| w.0 + w.1).max().unwrap();
        prop_assert_eq!(file_size(&l, &sizes), want);
    }
}

#[test]
fn stripe_bytes_bounds() {
    assert!(Layout::new(STRIPE_UNIT_BYTES, 1, 0, 1).is_ok());
    assert!(Layout::new(STRIPE_UNIT_BYTES + 1, 1, 0, 1).is_err());
    assert!(Layout::new(STRIPE_UNIT_BYTES - 1, 1, 0, 1).is_err());
    assert!(Layout::new(0, 1, 0, 1).is_err());
    assert!(Layout::new(STRIPE_BYTES_MAX, 1, 0, 1).is_ok());
    assert!(Layout::new(STRIPE_BYTES_MAX + STRIPE_UNIT_BYTES, 1, 0, 1).is_err());
}

#[test]
fn servers_and_count_bounds() {
    assert!(Layout::new(4096, 1, 0, SERVERS_MAX).is_ok());
    assert_eq!(Layout::new(4096, 1, 0, SERVERS_MAX + 1).unwrap_err().kind, ErrorKind::BadLayout);
    assert!(Layout::new(4096, 3, 0, 3).is_ok());
    assert!(Layout::new(4096, 4, 0, 3).is_err());
    assert!(Layout::new(4096, 0, 0, 3).is_err());
    assert!(Layout::new(4096, 1, 2, 3).is_ok());
    assert!(Layout::new(4096, 1, 3, 3).is_err());
}

#[test]
fn request_resolves_with_inheritance_and_all() {
    let all = LayoutRequest { stripe_bytes: 0, count: COUNT_ALL, start: 1 };
    let l = all.resolve(4, 0).unwrap();
    assert_eq!((l.stripe_bytes, l.count, l.start, l.servers), (STRIPE_BYTES_DEFAULT, 4, 1, 4));
    let child = LayoutRequest { stripe_bytes: 8192, count: 0, start: -1 }.inherit(&all);
    assert_eq!(child, LayoutRequest { stripe_bytes: 8192, count: COUNT_ALL, start: 1 });
    let spread = LayoutRequest::ROOT_DEFAULT.resolve(3, 7).unwrap();
    assert_eq!((spread.count, spread.start), (1, 1));
    assert!(LayoutRequest { stripe_bytes: 0, count: 5, start: -1 }.resolve(4, 0).is_err());
    assert!(LayoutRequest { stripe_bytes: 0, count: -2, start: -1 }.check().is_err());
    assert!(LayoutRequest { stripe_bytes: 0, count: SERVERS_MAX as i32, start: -1 }.check().is_ok());
    assert!(LayoutRequest { stripe_bytes: 0, count: SERVERS_MAX as i32 + 1, start: -1 }.check().is_err());
}

#[test]
fn map_pieces_bound_at_n_and_n_plus_one() {
    let l = Layout::new(STRIPE_UNIT_BYTES, 1, 0, 1).unwrap();
    let n = MAP_PIECES_MAX as u64 * STRIPE_UNIT_BYTES;
    assert_eq!(l.map_list(&[(0, n)]).unwrap().len(), MAP_PIECES_MAX);
    assert_eq!(l.map_list(&[(0, n + 1)]).unwrap_err().kind, ErrorKind::TooLarge);
    assert_eq!(l.map_list(&[(u64::MAX, 1)]).unwrap_err().kind, ErrorKind::TooLarge);
}

#[test]
fn one_object_merges_into_one_piece() {
    let l = Layout::new(512, 1, 0, 2).unwrap();
    let lists = group(&l.map_list(&[(100, 5000)]).unwrap());
    assert_eq!(lists.len(), 1);
    assert_eq!(lists[0].pieces, vec![(100, 5000)]);
}
