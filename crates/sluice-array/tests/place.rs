//! Placement: the Hungarian assignment is optimal (checked against brute
//! force), capacities follow the weights, the bound on the exact
//! method holds at N and N+1, and two-phase aggregators spread ties.

use proptest::prelude::*;
use sluice_array::{aggregators, capacities, place, PlacementInput, PlacementMethod, PLACEMENT_HUNGARIAN_UNITS_MAX};

fn input<'a>(bytes: &'a [Vec<u64>], rank_host: &'a [usize], server_host: &'a [usize], w: &'a [f64]) -> PlacementInput<'a> {
    PlacementInput { unit_rank_bytes: bytes, rank_host, server_host, server_weight: w, server_held_bytes: &[], hungarian_units_max: PLACEMENT_HUNGARIAN_UNITS_MAX }
}

/// The best local bytes over every assignment that respects `caps`.
fn brute_force(local: &dyn Fn(usize, usize) -> u64, units: usize, caps: &[usize]) -> u64 {
    fn go(u: usize, units: usize, left: &mut Vec<usize>, local: &dyn Fn(usize, usize) -> u64) -> u64 {
        if u == units {
            return 0;
        }
        let mut best = 0;
        for s in 0..left.len() {
            if left[s] > 0 {
                left[s] -= 1;
                best = best.max(local(u, s) + go(u + 1, units, left, local));
                left[s] += 1;
            }
        }
        best
    }
    go(0, units, &mut caps.to_vec(), local)
}

#[test]
fn hungarian_finds_the_known_optimum_that_greedy_misses() {
    // Two files, two servers on hosts 0 and 1, one file each. File 0 has
    // 10 bytes on host 0 and 9 on host 1; file 1 has 10 on host 0 only.
    // Best: file 0 to host 1, file 1 to host 0 (19 bytes stay local).
    let bytes = vec![vec![10, 9], vec![10, 0]];
    let (rank_host, server_host, w) = ([0, 1], [0, 1], [1.0, 1.0]);
    let p = place(&input(&bytes, &rank_host, &server_host, &w)).unwrap();
    assert_eq!(p.method, PlacementMethod::Hungarian);
    assert_eq!(p.unit_server, vec![1, 0]);
    assert_eq!((p.local_bytes, p.total_bytes), (19, 29));
    let mut greedy = input(&bytes, &rank_host, &server_host, &w);
    greedy.hungarian_units_max = 0;
    let g = place(&greedy).unwrap();
    assert_eq!(g.method, PlacementMethod::Greedy);
    assert_eq!(g.local_bytes, 10, "the greedy pass is the documented fallback, not optimal");
}

#[test]
fn hungarian_units_max_is_a_bound_at_n_and_n_plus_1() {
    let bytes = vec![vec![1]; 4];
    let (rank_host, server_host, w) = ([0], [0, 1], [1.0, 1.0]);
    let mut i = input(&bytes, &rank_host, &server_host, &w);
    i.hungarian_units_max = 4;
    assert_eq!(place(&i).unwrap().method, PlacementMethod::Hungarian);
    i.hungarian_units_max = 3;
    assert_eq!(place(&i).unwrap().method, PlacementMethod::Greedy);
}

#[test]
fn capacities_follow_the_weights_and_sum_to_the_files() {
    assert_eq!(capacities(12, &[1.0, 2.0, 3.0]), vec![2, 4, 6]);
    assert_eq!(capacities(5, &[1.0, 1.0]).iter().sum::<usize>(), 5);
    assert_eq!(capacities(0, &[1.0]), vec![0]);
    // A server three times as fast gets three times the files.
    let bytes = vec![vec![0]; 8];
    let p = place(&input(&bytes, &[0], &[0, 1], &[1.0, 3.0])).unwrap();
    assert_eq!(p.unit_server.iter().filter(|&&s| s == 1).count(), 6);
}

#[test]
fn bad_input_is_refused() {
    let bytes = vec![vec![1]];
    assert!(place(&input(&bytes, &[0], &[], &[])).is_err());
    assert!(place(&input(&bytes, &[0], &[0], &[0.0])).is_err());
    assert!(place(&input(&bytes, &[0, 0], &[0], &[1.0])).is_err());
}

proptest! {
    #[test]
    fn hungarian_matches_brute_force(
        units in 1usize..=5,
        ranks in 1usize..=4,
        hosts in 1usize..=3,
        servers in 1usize..=3,
        seed in prop::collection::vec(0u64..1000, 5 * 4),
        rank_host in prop::collection::vec(0usize..3, 4),
        server_host in prop::collection::vec(0usize..3, 3),
        weights in prop::collection::vec(1u32..4, 3),
    ) {
        let bytes: Vec<Vec<u64>> = (0..units).map(|u| (0..ranks).map(|r| seed[u * 4 + r]).collect()).collect();
        let rank_host: Vec<usize> = rank_host[..ranks].iter().map(|h| h % hosts).collect();
        let server_host: Vec<usize> = server_host[..servers].iter().map(|h| h % hosts).collect();
        let w: Vec<f64> = weights[..servers].iter().map(|&x| x as f64).collect();
        let p = place(&input(&bytes, &rank_host, &server_host, &w)).unwrap();
        let caps = capacities(units, &w);
        for (s, &cap) in caps.iter().enumerate() {
            prop_assert_eq!(p.unit_server.iter().filter(|&&x| x == s).count(), cap);
        }
        let local = |u: usize, s: usize| -> u64 {
            (0..ranks).filter(|&r| rank_host[r] == server_host[s]).map(|r| bytes[u][r]).sum()
        };
        prop_assert_eq!(p.local_bytes, brute_force(&local, units, &caps));
    }
}

#[test]
fn small_arrays_of_a_group_go_to_the_servers_holding_least() {
    // Adaptive-mesh patches: one-file arrays written one after another
    // over 3 servers. Without what the servers hold, every one would go
    // to server 0; with it, each goes to the least loaded.
    let (rank_host, server_host, w) = ([0usize], [0usize, 1, 2], [1.0, 1.0, 1.0]);
    let mut held = vec![0u64; 3];
    let sizes = [64u64, 8, 8, 32, 16, 8, 8];
    for &b in &sizes {
        let bytes = vec![vec![b]];
        let p = place(&PlacementInput { server_held_bytes: &held, ..input(&bytes, &rank_host, &server_host, &w) }).unwrap();
        held[p.unit_server[0]] += b;
    }
    // 64 | 8+32 (40) | 8+16+8+8 (40) : the first patch's server gets no
    // other; the rest even out.
    assert_eq!(held, vec![64, 40, 40]);
    // Without it: all on server 0.
    assert_eq!(capacities(1, &w), vec![1, 0, 0]);
    // What they hold only breaks ties of the weights' remainders.
    assert_eq!(sluice_array::capacities_held(1, &[1.0, 2.0], &[0, 30]), vec![0, 1], "a larger remainder first");
    assert_eq!(sluice_array::capacities_held(2, &[1.0, 1.0, 2.0], &[50, 10, 0]), vec![0, 1, 1]);
    let bad = place(&PlacementInput { server_held_bytes: &[1, 2], ..input(&[vec![1]], &rank_host, &server_host, &w) });
    assert!(bad.is_err());
}

/// Each file goes to the rank holding most of it, preferring ranks on its
/// server's host; files that ranks hold equally spread over them (the
/// fewest files so far, then the lower rank).
#[test]
fn aggregators_take_the_largest_holder_and_spread_ties() {
    // A 2 x 2 grid of blocks in chunks of half x and half z: ranks 0 and 1
    // hold files 0 and 1 half each, ranks 2 and 3 files 2 and 3.
    let tied = vec![vec![8, 8, 0, 0], vec![8, 8, 0, 0], vec![0, 0, 8, 8], vec![0, 0, 8, 8]];
    assert_eq!(aggregators(&tied, &[0; 4], &[0], &[0; 4]), vec![0, 1, 2, 3]);
    // A clear largest holder wins whatever it already has.
    let skewed = vec![vec![1, 9, 0, 0], vec![0, 9, 1, 0], vec![0, 0, 5, 5]];
    assert_eq!(aggregators(&skewed, &[0; 4], &[0], &[0; 3]), vec![1, 1, 2]);
    // Ranks on the file's server's host first, even holding less.
    let hosts = vec![vec![9, 1], vec![9, 1]];
    assert_eq!(aggregators(&hosts, &[0, 1], &[1], &[0, 0]), vec![1, 1]);
    // No rank on that host: the largest holder anywhere.
    assert_eq!(aggregators(&hosts, &[0, 0], &[1], &[0, 0]), vec![0, 0]);
}
