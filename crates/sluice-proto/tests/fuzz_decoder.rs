//! Property-based fuzzing of the decoder: random bytes never panic and are
//! never accepted past the bounds; every encodable message round-trips.

use proptest::prelude::*;
use sluice_proto::*;

/// Run both decoding steps over `bytes` the way a server does.
fn decode_all(bytes: &[u8], frame_bytes_max: u32) {
    let mut rest = bytes;
    while let Ok(Some(h)) = check_header(rest, frame_bytes_max) {
        assert!(h.body_len as usize + HEADER_BYTES <= frame_bytes_max as usize);
        let Some(body) = rest.get(HEADER_BYTES..HEADER_BYTES + h.body_len as usize) else { return };
        let _ = parse_request(&h, body);
        let _ = parse_response(&h, body);
        rest = &rest[HEADER_BYTES + h.body_len as usize..];
    }
}

fn path() -> impl Strategy<Value = String> {
    "[a-z./]{0,40}"
}

fn pieces() -> impl Strategy<Value = Vec<(u64, u64)>> {
    prop::collection::vec((0u64..1 << 40, 0u64..1 << 16), 0..20)
}

/// The ingredients of one request: kind, two paths, two numbers, pieces, data.
type Parts = (u8, String, String, u64, u64, Vec<(u64, u64)>, Vec<u8>);

fn request() -> impl Strategy<Value = Parts> {
    (0u8..34, path(), path(), any::<u64>(), any::<u32>().prop_map(u64::from), pieces(), prop::collection::vec(any::<u8>(), 0..64))
}

/// A valid post: the socket, or one of the records.
fn post(a: u64) -> u32 {
    if a.is_multiple_of(3) {
        NO_POST
    } else {
        (a % u64::from(POSTS_MAX)) as u32
    }
}

fn build<'a>(k: u8, p: &'a str, q: &'a str, a: u64, b: u64, pcs: &[(u64, u64)], data: &'a [u8]) -> Request<'a> {
    let fd = a;
    match k {
        0 => Request::Hello(Hello { version: VERSION, app: p, weight: b as u32, client_id: a as u32, cred: None }),
        18 => Request::Hello(Hello {
            version: VERSION,
            app: q,
            weight: 1,
            client_id: 7,
            cred: Some(Cred { uid: a as u32, gid: b as u32, groups: pcs.iter().map(|&(o, _)| o as u32).collect() }),
        }),
        19 => Request::Auth { mac: [a as u8; AUTH_BYTES], nonce: [b as u8; AUTH_BYTES] },
        20 => Request::ShmAttach { bytes: a },
        21 => Request::ReadShm { fd, offset: b >> 1, len: (a % u64::from(IO_BYTES_MAX)) as u32, at: b >> 2, post: post(a) },
        22 => Request::WriteShm { fd, offset: b >> 1, len: (a % u64::from(IO_BYTES_MAX)) as u32, at: b >> 2, post: post(a) },
        23 => Request::ReadLease { fd, offset: b >> 1, len: (a % u64::from(IO_BYTES_MAX)) as u32, at: b >> 2, post: post(a) },
        26 => Request::WriteLease { fd, offset: b >> 1, len: (a % u64::from(IO_BYTES_MAX)) as u32, at: b >> 2, post: post(a) },
        1 => Request::Open { path: p, flags: b as i32, mode: a as u32 },
        2 => Request::Close { fd },
        3 => Request::Read { fd, offset: b, len: (a % u64::from(IO_BYTES_MAX)) as u32 },
        4 => Request::Write { fd, offset: b, data },
        5 => Request::ReadList { fd, pieces: pcs.to_vec(), group: None },
        6 => Request::WriteList { fd, pieces: pcs.iter().map(|&(o, _)| (o, 1)).take(data.len()).collect(), data: &data[..pcs.len().min(data.len())], group: None },
        24 => Request::ReadList { fd, pieces: pcs.to_vec(), group: Some(Group { id: b, participants: (a % 65_536) as u32 + 1, wait_ms: b as u32 | 1 }) },
        25 => Request::WriteList {
            fd,
            pieces: pcs.iter().map(|&(o, _)| (o, 1)).take(data.len()).collect(),
            data: &data[..pcs.len().min(data.len())],
            group: Some(Group { id: a, participants: 1, wait_ms: 1 }),
        },
        7 => Request::Fsync { fd },
        8 => Request::Fdatasync { fd },
        9 => Request::Ftruncate { fd, len: b },
        10 => Request::Stat { path: p },
        11 => Request::Fstat { fd },
        12 => Request::Unlink { path: p },
        13 => Request::Rename { from: p, to: q },
        14 => Request::Mkdir { path: p, mode: b as u32 },
        15 => Request::Rmdir { path: p },
        16 => Request::Readdir { path: p, start: b as u32 },
        27 => Request::Nudge,
        28 => Request::Lstat { path: p },
        29 => Request::Readlink { path: p },
        30 => Request::Reserve { fd, len: b },
        31 => Request::Symlink { target: p, path: q },
        32 => Request::SetAttr { fd: a, path: p, mode: b as u32, atime_ns: a as i64, mtime_ns: b as i64, nofollow: a & 1 == 0 },
        33 => Request::Statfs { path: p },
        _ => Request::Stats,
    }
}

fn check_round_trip(id: u64, req: &Request<'_>) {
    let mut wire = Vec::new();
    encode_request(id, req, &mut wire).expect("within bounds");
    let h = check_header(&wire, FRAME_BYTES_MAX).expect("sane header").expect("complete header");
    assert_eq!(h.request_id, id);
    assert_eq!(h.body_len as usize + HEADER_BYTES, wire.len());
    assert_eq!(&parse_request(&h, &wire[HEADER_BYTES..]).expect("parses"), req);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512), max in 16u32..4096) {
        decode_all(&bytes, max);
    }

    #[test]
    fn mutated_valid_frames_never_panic((k, p, q, a, b, pcs, data) in request(), flips in prop::collection::vec((any::<usize>(), any::<u8>()), 1..4)) {
        let mut wire = Vec::new();
        encode_request(a, &build(k, &p, &q, a, b, &pcs, &data), &mut wire).expect("within bounds");
        for (i, v) in flips {
            let n = wire.len();
            wire[i % n] ^= v;
        }
        decode_all(&wire, FRAME_BYTES_MAX);
    }

    #[test]
    fn requests_round_trip((k, p, q, a, b, pcs, data) in request(), id in any::<u64>()) {
        check_round_trip(id, &build(k, &p, &q, a, b, &pcs, &data));
    }

    #[test]
    fn responses_round_trip(id in any::<u64>(), errno in any::<i32>(), msg in "[ -~]{0,80}", data in prop::collection::vec(any::<u8>(), 0..64), n in any::<u64>()) {
        let app = AppStats { name: msg.clone(), weight: 3, requests: n, dispatches: 1, bytes_read: 2, bytes_written: 3, bytes_leased: n >> 3, errors: 0, latency_us_log2: [n; LATENCY_BUCKETS] };
        let entries = vec![DirEntry { name: msg.clone(), kind: FileKind::Dir }];
        let stat = WireStat { size: n, mode: 0o100644, ino: n, mtime_ns: -1, ..WireStat::default() };
        let hello = HelloOk { version: VERSION, frame_bytes_max: 1, io_bytes_max: 2, inflight_per_connection_max: 3, proof: None };
        let proven = HelloOk { proof: Some([n as u8; AUTH_BYTES]), ..hello };
        for resp in [Response::Ok, Response::Fd(n, n ^ 1), Response::Data(&data), Response::Count(n), Response::Stat(stat), Response::HelloOk(hello), Response::HelloOk(proven),
                     Response::Dir { entries: entries.clone(), done: true }, Response::Stats(vec![app.clone()]), Response::Error { errno, message: &msg },
                     Response::Challenge { nonce: [n as u8; AUTH_BYTES] }, Response::Link(msg.clone()),
                     Response::Statfs(WireStatfs { block_bytes: 4096, io_bytes: n as u32, blocks: n, blocks_free: n >> 1, blocks_avail: n >> 2, files: !n, files_free: 7, name_max: 255 }),
                     Response::Lease { offset: n >> 1, len: n >> 2, valid_us: n as u32, lent: n % 2 == 0 }] {
            let mut wire = Vec::new();
            encode_response(id, &resp, &mut wire);
            let h = check_header(&wire, FRAME_BYTES_MAX).unwrap().unwrap();
            prop_assert_eq!(parse_response(&h, &wire[HEADER_BYTES..]).unwrap(), resp);
        }
    }
}

#[test]
fn frame_bytes_max_is_accepted_at_n_and_refused_at_n_plus_1() {
    let max = 64u32;
    let mut wire = Vec::new();
    encode_header(Opcode::Stats, 1, max - HEADER_BYTES as u32, &mut wire);
    assert!(check_header(&wire, max).unwrap().is_some());
    wire.clear();
    encode_header(Opcode::Stats, 1, max - HEADER_BYTES as u32 + 1, &mut wire);
    assert_eq!(check_header(&wire, max).unwrap_err().kind, ProtoErrorKind::TooLarge);
}

#[test]
fn list_pieces_max_is_accepted_at_n_and_refused_at_n_plus_1() {
    for (n, ok) in [(LIST_PIECES_MAX, true), (LIST_PIECES_MAX + 1, false)] {
        let mut wire = Vec::new();
        encode_request(1, &Request::ReadList { fd: 1, pieces: vec![(0, 1); n], group: None }, &mut wire).unwrap();
        let h = check_header(&wire, FRAME_BYTES_MAX).unwrap().unwrap();
        assert_eq!(parse_request(&h, &wire[HEADER_BYTES..]).is_ok(), ok, "{n} pieces");
    }
}

#[test]
fn a_post_record_past_the_area_is_refused() {
    // The last record is `POSTS_MAX - 1`; `NO_POST` is the socket.
    for (post, ok) in [(POSTS_MAX - 1, true), (POSTS_MAX, false), (NO_POST - 1, false), (NO_POST, true)] {
        let mut wire = Vec::new();
        encode_request(1, &Request::ReadShm { fd: 1, offset: 0, len: 4096, at: 0, post }, &mut wire).unwrap();
        let h = check_header(&wire, FRAME_BYTES_MAX).unwrap().unwrap();
        match parse_request(&h, &wire[HEADER_BYTES..]) {
            Ok(r) => assert!(ok && matches!(r, Request::ReadShm { post: p, .. } if p == post), "post {post}"),
            Err(e) => assert!(!ok && e.kind == ProtoErrorKind::Invalid && e.to_string().contains("post record"), "post {post}: {e}"),
        }
    }
}

#[test]
fn the_doorbell_is_the_post_area_s_last_record() {
    // 63 records answer; the 64th of the 4 KiB area is the doorbell, so a
    // request naming it is refused (above, at `POSTS_MAX`).
    assert_eq!(POSTS_MAX, 63);
    let len = (1 << 20) + POST_AREA_BYTES as usize;
    assert_eq!(sluice_proto::post::record_at(len, POSTS_MAX - 1) + POST_RECORD_BYTES as usize, sluice_proto::post::doorbell_at(len));
    assert_eq!(sluice_proto::post::doorbell_at(len) + POST_RECORD_BYTES as usize, len);
}

#[test]
fn a_nudge_has_no_body() {
    let mut wire = Vec::new();
    encode_request(0, &Request::Nudge, &mut wire).unwrap();
    assert_eq!(wire.len(), HEADER_BYTES);
    // A byte of body is refused like any trailing byte.
    let mut long = Vec::new();
    sluice_proto::encode_header(sluice_proto::Opcode::Nudge, 0, 1, &mut long);
    long.push(0);
    let h = check_header(&long, FRAME_BYTES_MAX).unwrap().unwrap();
    assert!(parse_request(&h, &long[HEADER_BYTES..]).is_err());
}

#[test]
fn malformed_headers_are_refused_with_their_kind() {
    let check = |bytes: &[u8], kind: ProtoErrorKind| assert_eq!(check_header(bytes, FRAME_BYTES_MAX).unwrap_err().kind, kind);
    let mut h = Vec::new();
    encode_header(Opcode::Stats, 9, 0, &mut h);
    assert_eq!(check_header(&h[..HEADER_BYTES - 1], FRAME_BYTES_MAX), Ok(None), "truncated header waits for more");
    let mut bad_op = h.clone();
    bad_op[4] = 0x7e;
    check(&bad_op, ProtoErrorKind::UnknownOpcode);
    let mut flags = h.clone();
    flags[6] = 1;
    check(&flags, ProtoErrorKind::BadFlags);
    let mut huge = h.clone();
    huge[..4].copy_from_slice(&u32::MAX.to_le_bytes());
    check(&huge, ProtoErrorKind::TooLarge);
}

#[test]
fn read_longer_than_io_bytes_max_is_refused() {
    let mut wire = Vec::new();
    encode_request(1, &Request::Read { fd: 1, offset: 0, len: IO_BYTES_MAX + 1 }, &mut wire).unwrap();
    let h = check_header(&wire, FRAME_BYTES_MAX).unwrap().unwrap();
    assert_eq!(parse_request(&h, &wire[HEADER_BYTES..]).unwrap_err().kind, ProtoErrorKind::TooLarge);
}

#[test]
fn a_path_of_path_bytes_max_passes_and_one_byte_more_is_enametoolong_at_both_ends() {
    let ok = "a".repeat(PATH_BYTES_MAX);
    check_round_trip(1, &Request::Unlink { path: &ok });
    let long = "a".repeat(PATH_BYTES_MAX + 1);
    for req in [Request::Unlink { path: &long }, Request::Open { path: &long, flags: 0, mode: 0 }, Request::Rename { from: "x", to: &long }] {
        let mut wire = b"kept".to_vec();
        let e = encode_request(1, &req, &mut wire).unwrap_err();
        assert_eq!((e.kind, e.errno(), wire.as_slice()), (ProtoErrorKind::NameTooLong, libc_enametoolong(), b"kept".as_slice()), "never cut, buffer untouched");
    }
    // A peer that sends one anyway: the server's decoder says ENAMETOOLONG.
    let mut wire = Vec::new();
    encode_request(1, &Request::Mkdir { path: &ok, mode: 0 }, &mut wire).unwrap();
    let n = PATH_BYTES_MAX as u16 + 1;
    let at = HEADER_BYTES + 4;
    wire[at..at + 2].copy_from_slice(&n.to_le_bytes());
    wire.push(b'a');
    let body_len = (wire.len() - HEADER_BYTES) as u32;
    wire[..4].copy_from_slice(&body_len.to_le_bytes());
    let h = check_header(&wire, FRAME_BYTES_MAX).unwrap().unwrap();
    assert_eq!(parse_request(&h, &wire[HEADER_BYTES..]).unwrap_err().errno(), libc_enametoolong());
}

fn libc_enametoolong() -> i32 {
    36
}

#[test]
fn cred_groups_max_is_accepted_at_n_and_refused_at_n_plus_1() {
    for (n, ok) in [(CRED_GROUPS_MAX, true), (CRED_GROUPS_MAX + 1, false)] {
        let hello = Request::Hello(Hello { version: VERSION, app: "a", weight: 1, client_id: 1, cred: Some(Cred { uid: 1, gid: 2, groups: vec![3; n] }) });
        let mut wire = Vec::new();
        assert_eq!(encode_request(1, &hello, &mut wire).is_ok(), ok, "{n} groups");
        if ok {
            check_round_trip(1, &hello);
        }
    }
}

#[test]
fn group_participants_are_bounded_at_n_and_n_plus_1() {
    let parse = |participants: u32, wait_ms: u32| {
        let req = Request::ReadList { fd: 1, pieces: vec![(0, 8)], group: Some(Group { id: 7, participants, wait_ms }) };
        let mut wire = Vec::new();
        encode_request(1, &req, &mut wire).unwrap();
        let h = check_header(&wire, FRAME_BYTES_MAX).unwrap().unwrap();
        assert_eq!(h.opcode, Opcode::ReadListGroup);
        parse_request(&h, &wire[HEADER_BYTES..]).map(|r| matches!(r, Request::ReadList { group: Some(g), .. } if g.participants == participants))
    };
    assert_eq!(parse(GROUP_PARTICIPANTS_MAX, 1), Ok(true));
    assert_eq!(parse(GROUP_PARTICIPANTS_MAX + 1, 1).unwrap_err().kind, ProtoErrorKind::TooLarge);
    assert!(parse(0, 1).is_err(), "a group of nobody");
    assert!(parse(1, 0).is_err(), "a wait of zero");
}

#[test]
fn a_hello_is_recognised_after_a_foreign_length_prefix_and_nothing_else_is() {
    let hello = Request::Hello(Hello { version: VERSION, app: "a", weight: 1, client_id: 7, cred: None });
    let mut frame = Vec::new();
    encode_request(42, &hello, &mut frame).unwrap();
    assert_eq!(hello_after_length(&frame[4..]), Some(42));
    assert_eq!(request_id_of(frame[..HEADER_BYTES].try_into().unwrap()), 42);
    let mut stat = Vec::new();
    encode_request(43, &Request::Stat { path: "x" }, &mut stat).unwrap();
    assert_eq!(hello_after_length(&stat[4..]), None, "another request");
    assert_eq!(hello_after_length(br#"{"Lookup":{"path":"a"}}"#), None, "JSON");
    assert_eq!(hello_after_length(&frame[4..10]), None, "too short");
}

#[test]
fn the_largest_hello_and_an_auth_fit_the_handshake_frame_bound() {
    let app = "a".repeat(APP_NAME_BYTES_MAX);
    let groups: Vec<u32> = (0..CRED_GROUPS_MAX as u32).map(|g| g + 1_000_000).collect();
    let hello = Request::Hello(Hello { version: VERSION, app: &app, weight: u32::MAX, client_id: u32::MAX, cred: Some(Cred { uid: u32::MAX, gid: u32::MAX, groups }) });
    let mut wire = Vec::new();
    encode_request(u64::MAX, &hello, &mut wire).unwrap();
    assert!(wire.len() <= HANDSHAKE_FRAME_BYTES_MAX as usize, "{} bytes", wire.len());
    check_header(&wire, HANDSHAKE_FRAME_BYTES_MAX).unwrap().expect("a whole header");
    let mut auth = Vec::new();
    encode_request(1, &Request::Auth { mac: [7; AUTH_BYTES], nonce: [8; AUTH_BYTES] }, &mut auth).unwrap();
    assert!(auth.len() <= HANDSHAKE_FRAME_BYTES_MAX as usize);
}
