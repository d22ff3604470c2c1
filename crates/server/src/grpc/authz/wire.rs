//! The request's wire form as the authorization layer reads it, before any handler: one
//! gRPC message read through a hard limit, its framing checked (uncompressed, exactly one
//! message), and the few fields authorization needs (`cell_id`, a BeginUpdate's claim count)
//! walked without decoding the message. Also the replayed bodies the layer hands on.
//!
//! Owns reading and walking bytes only: who may call what is `crate::auth`'s, what is audited
//! `authz::record`'s.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{BufMut, Bytes, BytesMut};
use http_body_util::BodyExt;
use tonic::body::Body;

use crate::auth::Method;

/// Reads the request's body up to its end through a hard limit: at most one gRPC message of at
/// most `max_message_bytes` (the guard already refused a larger declared length).
pub(super) async fn read_message(
    body: &mut Body,
    max_message_bytes: usize,
) -> Result<Bytes, tonic::Status> {
    let mut buffered = BytesMut::new();
    while let Some(frame) = body.frame().await {
        let frame = frame?;
        if let Ok(data) = frame.into_data() {
            if buffered.len() + data.len() > 5 + max_message_bytes {
                return Err(tonic::Status::invalid_argument(format!(
                    "a request carries one message of at most {max_message_bytes} bytes; this \
                     body is longer"
                )));
            }
            buffered.extend_from_slice(&data);
        }
    }
    Ok(buffered.freeze())
}

/// The one uncompressed message of a unary request body, or the status its refusal gets.
pub(super) fn the_message<'b>(
    body: &'b [u8],
    encoding: Option<&http::HeaderValue>,
) -> Result<&'b [u8], tonic::Status> {
    let Some((prefix, rest)) = body.split_at_checked(5) else {
        return Err(tonic::Status::invalid_argument(
            "the request body holds no complete gRPC message prefix",
        ));
    };
    match prefix[0] {
        0 => {}
        // gRPC: a compressed flag with no (or the identity) encoding is INTERNAL; an encoding
        // the server does not accept is UNIMPLEMENTED. This server accepts none, so the bytes
        // checked here are always the bytes the handler decodes.
        1 => {
            return Err(match encoding.and_then(|e| e.to_str().ok()) {
                Some(name) if name != "identity" => tonic::Status::unimplemented(format!(
                    "grpc-encoding {name:?} is not accepted: send requests uncompressed"
                )),
                _ => tonic::Status::internal(
                    "a compressed message without a grpc-encoding: send requests uncompressed",
                ),
            })
        }
        flag => {
            return Err(tonic::Status::invalid_argument(format!(
                "the gRPC message flag is {flag}, not 0 (uncompressed)"
            )))
        }
    }
    let length = u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]) as usize;
    match rest.len().cmp(&length) {
        std::cmp::Ordering::Equal => Ok(rest),
        std::cmp::Ordering::Less => Err(tonic::Status::invalid_argument(format!(
            "the request message declares {length} bytes but the body ends after {}",
            rest.len()
        ))),
        std::cmp::Ordering::Greater => Err(tonic::Status::invalid_argument(
            "a unary request carries exactly one message; this body has more",
        )),
    }
}

/// What authorization needs of a request message, read from its wire fields without decoding
/// it: the `cell_id` (field 1, for the methods that carry one) and, of a BeginUpdate, how many
/// claims it carries (fields 2, 3, 5).
#[derive(Debug, Default, PartialEq)]
pub(super) struct RequestShape {
    pub(super) cell_id: String,
    pub(super) claims: usize,
}

impl RequestShape {
    pub(super) fn read(method: Method, message: &[u8]) -> Result<Self, String> {
        let mut shape = RequestShape::default();
        for field in Fields::new(message) {
            let (number, value) = field?;
            match (number, value) {
                (1, Value::Bytes(bytes)) if method.has_cell_id() => {
                    shape.cell_id = String::from_utf8(bytes.to_vec())
                        .map_err(|_| "cell_id (field 1) is not UTF-8".to_owned())?;
                }
                (1, _) if method.has_cell_id() => {
                    return Err("cell_id (field 1) is not a string".into())
                }
                (2 | 3 | 5, _) if method == Method::BeginUpdate => shape.claims += 1,
                _ => {}
            }
        }
        Ok(shape)
    }
}

/// A field's value on the wire.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Value<'m> {
    Varint(u64),
    Fixed,
    Bytes(&'m [u8]),
}

/// The fields of a protobuf message in wire order; an error ends it.
pub(super) struct Fields<'m> {
    message: &'m [u8],
    at: usize,
    failed: bool,
}

impl<'m> Fields<'m> {
    pub(super) fn new(message: &'m [u8]) -> Self {
        Fields {
            message,
            at: 0,
            failed: false,
        }
    }

    fn next_field(&mut self) -> Result<(u64, Value<'m>), String> {
        let key = varint(self.message, &mut self.at).ok_or("a field key is cut short")?;
        let number = key >> 3;
        if number == 0 {
            return Err("field number 0".into());
        }
        let skip = |at: &mut usize, n: usize, len: usize| -> Result<(), String> {
            *at = at
                .checked_add(n)
                .filter(|end| *end <= len)
                .ok_or_else(|| format!("field {number} runs past the end"))?;
            Ok(())
        };
        let value = match key & 7 {
            0 => Value::Varint(varint(self.message, &mut self.at).ok_or("a varint is cut short")?),
            1 => {
                skip(&mut self.at, 8, self.message.len())?;
                Value::Fixed
            }
            2 => {
                let length = varint(self.message, &mut self.at)
                    .and_then(|l| usize::try_from(l).ok())
                    .ok_or("a length is cut short")?;
                let start = self.at;
                skip(&mut self.at, length, self.message.len())?;
                Value::Bytes(&self.message[start..self.at])
            }
            5 => {
                skip(&mut self.at, 4, self.message.len())?;
                Value::Fixed
            }
            wire => return Err(format!("field {number} has wire type {wire}")),
        };
        Ok((number, value))
    }
}

impl<'m> Iterator for Fields<'m> {
    type Item = Result<(u64, Value<'m>), String>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.at >= self.message.len() {
            return None;
        }
        let field = self.next_field();
        self.failed = field.is_err();
        Some(field)
    }
}

/// A body replayed from bytes already read: the data, then the trailers (a response's
/// grpc-status).
pub(super) struct Replay {
    pub(super) data: Option<Bytes>,
    pub(super) trailers: Option<http::HeaderMap>,
}

impl Replay {
    pub(super) fn data(data: Bytes) -> Self {
        Replay {
            data: Some(data),
            trailers: None,
        }
    }
}

impl http_body::Body for Replay {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, tonic::Status>>> {
        if let Some(data) = self.data.take() {
            return Poll::Ready(Some(Ok(http_body::Frame::data(data))));
        }
        Poll::Ready(
            self.trailers
                .take()
                .map(|t| Ok(http_body::Frame::trailers(t))),
        )
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none() && self.trailers.is_none()
    }
}

/// The first gRPC message of a body (5-byte prefix: flag, big-endian length), uncompressed.
pub(super) fn first_message(body: &[u8]) -> Option<&[u8]> {
    let (prefix, rest) = body.split_at_checked(5)?;
    if prefix[0] != 0 {
        return None;
    }
    let length = u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]) as usize;
    rest.get(..length)
}

fn varint(bytes: &[u8], at: &mut usize) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *bytes.get(*at)?;
        *at += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

/// The body with `cell_id` (field 1) set to `cell_id`: appended to the message (a later
/// occurrence wins), the length prefix adjusted.
pub(super) fn with_cell_id(body: &[u8], cell_id: &str) -> Option<Bytes> {
    let message = first_message(body)?;
    let mut field = BytesMut::new();
    field.put_u8(0x0a);
    let mut length = cell_id.len();
    while length >= 0x80 {
        field.put_u8((length as u8 & 0x7f) | 0x80);
        length >>= 7;
    }
    field.put_u8(length as u8);
    field.put_slice(cell_id.as_bytes());
    let total = u32::try_from(message.len() + field.len()).ok()?;
    let mut out = BytesMut::with_capacity(5 + total as usize + body.len());
    out.put_u8(0);
    out.put_u32(total);
    out.put_slice(message);
    out.put_slice(&field);
    out.put_slice(&body[5 + message.len()..]);
    Some(out.freeze())
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;
    use crate::grpc::pb;
    use topology_claims::domain;

    fn framed(message: &impl Message) -> Vec<u8> {
        let bytes = message.encode_to_vec();
        let mut out = vec![0];
        out.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
        out.extend_from_slice(&bytes);
        out
    }

    fn cell_id_of(method: Method, body: &[u8]) -> Option<String> {
        let message = the_message(body, None).ok()?;
        RequestShape::read(method, message).ok().map(|s| s.cell_id)
    }

    #[test]
    fn the_cell_id_is_read_from_every_request_that_has_one() {
        let commit = pb::CommitUpdateRequest {
            cell_id: "cell-b".into(),
            lease_id: "0b6a4cf6-3f5e-4a47-9c1e-2b8c2d9a7e10".into(),
        };
        assert_eq!(
            cell_id_of(Method::CommitUpdate, &framed(&commit)).as_deref(),
            Some("cell-b")
        );
        let list = pb::ListClaimsRequest {
            cell_id: String::new(),
            table_name: 1,
            cursor: 5,
            limit: 3,
            ..Default::default()
        };
        assert_eq!(
            cell_id_of(Method::ListClaims, &framed(&list)).as_deref(),
            Some("")
        );
        for (what, message) in [
            ("truncated", vec![0x0a, 5, b'a']),
            ("not UTF-8", vec![0x0a, 2, 0xC3, 0x28]),
            ("a varint cell_id", vec![0x08, 1]),
            ("field number 0", vec![0x00, 1]),
            ("a tag with no end", vec![0xFF; 16]),
            ("wire type 7", vec![0x0F]),
        ] {
            assert!(
                RequestShape::read(Method::CommitUpdate, &message).is_err(),
                "{what}"
            );
        }
    }

    #[test]
    fn claims_are_counted_from_the_wire_without_decoding_them() {
        // Two million empty ClaimRecords (0x12 0x00): counted, nothing materialized.
        let mut message = vec![0x0a, 6];
        message.extend_from_slice(b"cell-b");
        for _ in 0..2_000_000 {
            message.extend_from_slice(&[0x12, 0x00]);
        }
        message.extend_from_slice(&[0x1a, 0x00, 0x2a, 0x00]);
        let shape = RequestShape::read(Method::BeginUpdate, &message).unwrap();
        assert_eq!(shape.claims, 2_000_002);
        assert_eq!(shape.cell_id, "cell-b");
        assert!(domain::check_batch_size(shape.claims, 1000).is_err());
        assert!(domain::check_batch_size(1000, 1000).is_ok());
    }

    #[test]
    fn a_body_that_is_not_one_plain_message_is_refused() {
        let message = pb::CommitUpdateRequest::default().encode_to_vec();
        let mut body = framed(&pb::CommitUpdateRequest {
            cell_id: "a".into(),
            ..Default::default()
        });
        assert!(the_message(&body, None).is_ok());
        let code = |body: &[u8], encoding: Option<&str>| {
            let header = encoding.map(|e| http::HeaderValue::from_str(e).unwrap());
            the_message(body, header.as_ref()).unwrap_err().code()
        };
        let mut compressed = body.clone();
        compressed[0] = 1;
        assert_eq!(code(&compressed, None), tonic::Code::Internal);
        assert_eq!(code(&compressed, Some("gzip")), tonic::Code::Unimplemented);
        compressed[0] = 7;
        assert_eq!(code(&compressed, None), tonic::Code::InvalidArgument);
        assert_eq!(
            code(&body[..3], None),
            tonic::Code::InvalidArgument,
            "cut prefix"
        );
        assert_eq!(
            code(&body[..body.len() - 1], None),
            tonic::Code::InvalidArgument
        );
        body.extend_from_slice(&framed(&pb::CommitUpdateRequest::default()));
        assert_eq!(
            code(&body, None),
            tonic::Code::InvalidArgument,
            "two messages"
        );
        assert_eq!(code(&[], None), tonic::Code::InvalidArgument, "no message");
        assert!(message.is_empty());
    }

    #[test]
    fn an_empty_cell_id_is_filled_in_and_the_rest_kept() {
        let request = pb::RenewLeaseRequest {
            cell_id: String::new(),
            lease_id: "0b6a4cf6-3f5e-4a47-9c1e-2b8c2d9a7e10".into(),
        };
        let body = with_cell_id(&framed(&request), "cell-a").unwrap();
        let decoded = pb::RenewLeaseRequest::decode(the_message(&body, None).unwrap()).unwrap();
        assert_eq!(decoded.cell_id, "cell-a");
        assert_eq!(decoded.lease_id, request.lease_id);
    }
}
