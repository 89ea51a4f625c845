//! One case per refusal, and two properties: a chunked body fed in pieces split anywhere decodes
//! to the same bytes and ends at the same place, and no input panics.

use super::*;
use proptest::prelude::*;

/// Feeds `pieces` one after another; returns the body, whether it ended, and what was left in the
/// buffer after its end.
fn decode_pieces(pieces: &[&[u8]]) -> Result<(Vec<u8>, bool, Vec<u8>), ChunkedError> {
    let mut decoder = ChunkedDecoder::new();
    let mut buf = BytesMut::new();
    let mut body = Vec::new();
    for (i, piece) in pieces.iter().enumerate() {
        buf.extend_from_slice(piece);
        loop {
            match decoder.decode(&mut buf)? {
                Chunk::Data(data) => {
                    assert!(!data.is_empty(), "no empty data pieces");
                    body.extend_from_slice(&data);
                }
                Chunk::NeedMore => break,
                Chunk::End => {
                    assert!(decoder.is_done());
                    let mut left = buf.to_vec();
                    left.extend(pieces[i + 1..].concat());
                    return Ok((body, true, left));
                }
            }
        }
    }
    Ok((body, false, buf.to_vec()))
}

fn decode_whole(text: &[u8]) -> Result<(Vec<u8>, bool, Vec<u8>), ChunkedError> {
    decode_pieces(&[text])
}

fn refused(text: &[u8]) -> ChunkedError {
    match decode_whole(text) {
        Err(e) => e,
        Ok(found) => panic!("{:?} was accepted: {found:?}", String::from_utf8_lossy(text)),
    }
}

#[test]
fn a_body_decodes_and_what_follows_is_left() {
    let (body, ended, left) =
        decode_whole(b"5\r\nhello\r\n7\r\n, world\r\n0\r\n\r\nGET / HTTP/1.1\r\n").expect("valid");
    assert_eq!(body, b"hello, world");
    assert!(ended);
    assert_eq!(left, b"GET / HTTP/1.1\r\n");
}

#[test]
fn data_comes_out_as_slices_of_the_buffer() {
    let mut buf = BytesMut::with_capacity(64);
    buf.extend_from_slice(b"5\r\nhello\r\n0\r\n\r\n");
    let range = buf.as_ptr() as usize..buf.as_ptr() as usize + buf.capacity();
    let mut decoder = ChunkedDecoder::new();
    let Ok(Chunk::Data(data)) = decoder.decode(&mut buf) else { panic!("data first") };
    assert_eq!(&data[..], b"hello");
    assert!(range.contains(&(data.as_ptr() as usize)), "the data was copied");
}

#[test]
fn hex_sizes_in_either_case_and_extensions_and_trailers_are_read_and_dropped() {
    let text =
        b"A;name=value;q=\"x y\"\r\n0123456789\r\n1 ; ext\r\nz\r\n0;last\r\nTrailer-One: 1\r\nTrailer-Two: 2\r\n\r\n";
    let (body, ended, left) = decode_whole(text).expect("valid");
    assert_eq!(body, b"0123456789z");
    assert!(ended);
    assert!(left.is_empty());
    let (body, _, _) = decode_whole(b"a\r\n0123456789\r\n0\r\n\r\n").expect("lower case");
    assert_eq!(body.len(), 10);
}

#[test]
fn an_incomplete_body_asks_for_more() {
    let (body, ended, _) = decode_whole(b"5\r\nhel").expect("valid so far");
    assert_eq!(body, b"hel");
    assert!(!ended);
    let (_, ended, _) = decode_whole(b"5\r\nhello\r\n0\r\n").expect("valid so far");
    assert!(!ended, "the final empty line is still to come");
}

#[test]
fn a_size_that_is_not_hex_is_refused() {
    for text in [&b"x\r\n"[..], b"0x5\r\nhello\r\n", b"+5\r\n", b"-5\r\n", b"\r\n", b";ext\r\n", b"5 5\r\n", b" 5\r\n"]
    {
        assert_eq!(refused(text), ChunkedError::BadSize, "{:?}", String::from_utf8_lossy(text));
    }
}

#[test]
fn a_size_longer_than_sixteen_digits_is_refused() {
    assert_eq!(refused(b"00000000000000005\r\n"), ChunkedError::SizeTooLong);
    // Sixteen digits are fine (leading zeros included).
    let (body, ended, _) = decode_whole(b"0000000000000005\r\nhello\r\n0\r\n\r\n").expect("sixteen digits");
    assert_eq!((body.as_slice(), ended), (&b"hello"[..], true));
}

#[test]
fn a_bare_lf_or_cr_in_a_size_line_is_refused() {
    assert_eq!(refused(b"5\nhello\r\n"), ChunkedError::BadLineEnd);
    assert_eq!(refused(b"5\rhello\r\n"), ChunkedError::BadLineEnd);
    assert_eq!(refused(b"5;a\nhello"), ChunkedError::BadExtension);
    assert_eq!(refused(b"0\r\n\n"), ChunkedError::BadTrailer);
    assert_eq!(refused(b"0\r\n\rx"), ChunkedError::BadLineEnd);
}

#[test]
fn data_not_followed_by_crlf_is_refused() {
    assert_eq!(refused(b"5\r\nhelloX\r\n"), ChunkedError::MissingCrlf);
    assert_eq!(refused(b"5\r\nhello\n0\r\n\r\n"), ChunkedError::MissingCrlf);
    assert_eq!(refused(b"5\r\nhello\rX"), ChunkedError::MissingCrlf);
    // Any byte but CR where the CR belongs, even followed by an LF.
    assert_eq!(refused(b"5\r\nhelloX\n0\r\n\r\n"), ChunkedError::MissingCrlf);
}

#[test]
fn a_control_character_in_an_extension_is_refused() {
    assert_eq!(refused(b"5;a\x00b\r\nhello\r\n"), ChunkedError::BadExtension);
}

#[test]
fn extensions_beyond_their_bound_are_refused() {
    let mut text = b"5;".to_vec();
    text.extend(std::iter::repeat_n(b'a', MAX_EXTENSION_BYTES + 1));
    assert_eq!(refused(&text), ChunkedError::ExtensionTooLong);
}

#[test]
fn a_folded_or_malformed_trailer_is_refused() {
    assert_eq!(refused(b"0\r\nA: 1\r\n folded\r\n\r\n"), ChunkedError::BadTrailer);
    assert_eq!(refused(b"0\r\nA: 1\x01\r\n\r\n"), ChunkedError::BadTrailer);
    assert_eq!(refused(b"0\r\nA: 1\n\r\n"), ChunkedError::BadTrailer);
}

#[test]
fn trailers_beyond_their_bound_are_refused() {
    let mut text = b"0\r\n".to_vec();
    for _ in 0..(MAX_TRAILER_BYTES / 16 + 1) {
        text.extend_from_slice(b"X-Trailer: 1234\r\n");
    }
    assert_eq!(refused(&text), ChunkedError::TrailersTooLarge);
}

/// A chunked body: its data, and its encoding (with extensions and trailers at random).
fn chunked_body() -> impl Strategy<Value = (Vec<u8>, Vec<u8>)> {
    let chunk =
        (prop::collection::vec(any::<u8>(), 1..300), prop::option::of("[a-z]{1,8}(=[a-z0-9]{1,8})?"), any::<bool>());
    let trailers = prop::collection::vec("[A-Za-z-]{1,10}: [ -~]{0,20}", 0..3);
    (prop::collection::vec(chunk, 0..8), trailers, prop::option::of("[a-z]{1,5}")).prop_map(
        |(chunks, trailers, last_ext)| {
            let (mut data, mut text) = (Vec::new(), Vec::new());
            for (bytes, ext, upper) in chunks {
                let size = if upper { format!("{:X}", bytes.len()) } else { format!("{:x}", bytes.len()) };
                text.extend_from_slice(size.as_bytes());
                if let Some(ext) = ext {
                    text.extend_from_slice(format!(";{ext}").as_bytes());
                }
                text.extend_from_slice(b"\r\n");
                text.extend_from_slice(&bytes);
                text.extend_from_slice(b"\r\n");
                data.extend(bytes);
            }
            text.push(b'0');
            if let Some(ext) = last_ext {
                text.extend_from_slice(format!(" ;{ext}").as_bytes());
            }
            text.extend_from_slice(b"\r\n");
            for trailer in trailers {
                text.extend_from_slice(trailer.trim_end().as_bytes());
                text.extend_from_slice(b"\r\n");
            }
            text.extend_from_slice(b"\r\n");
            (data, text)
        },
    )
}

proptest! {
    #[test]
    fn a_body_split_anywhere_decodes_as_it_does_whole(
        (data, text) in chunked_body(),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..6),
        next in "[ -~]{0,20}",
    ) {
        let mut text = text;
        text.extend_from_slice(next.as_bytes());
        let mut at: Vec<usize> = cuts.iter().map(|c| c.index(text.len() + 1)).collect();
        at.push(0);
        at.push(text.len());
        at.sort_unstable();
        let pieces: Vec<&[u8]> = at.windows(2).map(|w| &text[w[0]..w[1]]).collect();
        let (body, ended, left) = decode_pieces(&pieces).expect("a valid body");
        prop_assert_eq!(body, data);
        prop_assert!(ended);
        prop_assert_eq!(left, next.into_bytes());
    }

    #[test]
    fn no_input_panics(bytes in prop::collection::vec(any::<u8>(), 0..400), cut in any::<prop::sample::Index>()) {
        let at = cut.index(bytes.len() + 1);
        let _ = decode_pieces(&[&bytes[..at], &bytes[at..]]);
    }
}
