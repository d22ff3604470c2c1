//! The one layer that applies the authorization table (`crate::auth`) to every request, before
//! any handler and before any store access: it reads the caller from the connection, the method
//! from the path and, for methods that carry one, the request's `cell_id` (field 1 of every such
//! request message) from the request body; a refusal is answered here (UNAUTHENTICATED, or
//! PERMISSION_DENIED with ErrorInfo reason `CELL_ID_MISMATCH` / `ROLE_NOT_ALLOWED`); a cell's
//! empty `cell_id` is filled in with its own, so the handler acts as that cell.
//!
//! Owns applying the table; the table itself is `crate::auth`'s. Runs inside the request guard,
//! so the body it reads is already within the byte budgets.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{BufMut, Bytes, BytesMut};
use http_body_util::BodyExt;
use tonic::body::Body;
use tower_layer::Layer;
use tower_service::Service;

use crate::auth::{authorize, Caller, Decision, Method};
use crate::error::ClaimsError;
use crate::grpc::listener::ConnInfo;
use crate::grpc::status::to_status;

/// Builds [`Authorize`] services.
#[derive(Clone, Copy, Debug, Default)]
pub struct AuthorizeLayer;

impl<S> Layer<S> for AuthorizeLayer {
    type Service = Authorize<S>;

    fn layer(&self, inner: S) -> Authorize<S> {
        Authorize { inner }
    }
}

#[derive(Clone)]
pub struct Authorize<S> {
    inner: S,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S> Service<http::Request<Body>> for Authorize<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<Result<http::Response<Body>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let method = Method::from_path(request.uri().path());
        let caller = request
            .extensions()
            .get::<ConnInfo>()
            .map_or(Caller::Anonymous, |info| info.caller.clone());
        // The ready service goes with this request; a clone waits for the next one.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(async move {
            if !method.has_cell_id() || caller == Caller::Anonymous {
                return match authorize(&caller, method, "") {
                    Decision::Allow { .. } => inner.call(request).await,
                    refusal => Ok(refuse(refusal)),
                };
            }
            let (parts, body) = request.into_parts();
            let bytes = match body.collect().await {
                Ok(collected) => collected.to_bytes(),
                Err(status) => return Ok(status.into_http()),
            };
            let cell_id = first_message(&bytes)
                .and_then(cell_id_field)
                .unwrap_or_default();
            match authorize(&caller, method, &cell_id) {
                Decision::Allow { fill_cell_id } => {
                    let bytes = match fill_cell_id {
                        Some(own) => with_cell_id(&bytes, &own).unwrap_or(bytes),
                        None => bytes,
                    };
                    let request = http::Request::from_parts(
                        parts,
                        Body::new(http_body_util::Full::new(bytes)),
                    );
                    inner.call(request).await
                }
                refusal => Ok(refuse(refusal)),
            }
        })
    }
}

fn refuse(decision: Decision) -> http::Response<Body> {
    let error = match decision {
        Decision::Unauthenticated { message } => ClaimsError::Unauthenticated { message },
        Decision::Denied { reason, message } => ClaimsError::PermissionDenied {
            reason: reason.to_owned(),
            message,
        },
        Decision::Allow { .. } => unreachable!("only refusals are answered here"),
    };
    tracing::info!(%error, "request refused");
    to_status(&error).into_http()
}

/// The first gRPC message of a body (5-byte prefix: flag, big-endian length), uncompressed.
fn first_message(body: &[u8]) -> Option<&[u8]> {
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

/// Field 1 as a string (the last one, as protobuf decoding keeps), or `None` when the message
/// does not parse (the handler's decoder then refuses it).
fn cell_id_field(message: &[u8]) -> Option<String> {
    let mut at = 0;
    let mut found = String::new();
    while at < message.len() {
        let key = varint(message, &mut at)?;
        match key & 7 {
            0 => {
                varint(message, &mut at)?;
            }
            1 => at = at.checked_add(8)?,
            2 => {
                let length = usize::try_from(varint(message, &mut at)?).ok()?;
                let end = at.checked_add(length)?;
                let value = message.get(at..end)?;
                if key >> 3 == 1 {
                    found = String::from_utf8(value.to_vec()).ok()?;
                }
                at = end;
            }
            5 => at = at.checked_add(4)?,
            _ => return None,
        }
    }
    (at == message.len()).then_some(found)
}

/// The body with `cell_id` (field 1) set to `cell_id`: appended to the message (a later
/// occurrence wins), the length prefix adjusted.
fn with_cell_id(body: &[u8], cell_id: &str) -> Option<Bytes> {
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

    fn framed(message: &impl Message) -> Vec<u8> {
        let bytes = message.encode_to_vec();
        let mut out = vec![0];
        out.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
        out.extend_from_slice(&bytes);
        out
    }

    #[test]
    fn the_cell_id_is_read_from_every_request_that_has_one() {
        let commit = pb::CommitUpdateRequest {
            cell_id: "cell-b".into(),
            lease_id: "0b6a4cf6-3f5e-4a47-9c1e-2b8c2d9a7e10".into(),
        };
        let body = framed(&commit);
        assert_eq!(
            first_message(&body).and_then(cell_id_field).as_deref(),
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
            first_message(&framed(&list))
                .and_then(cell_id_field)
                .as_deref(),
            Some("")
        );
        assert_eq!(cell_id_field(&[0x0a, 5, b'a']), None, "truncated");
    }

    #[test]
    fn an_empty_cell_id_is_filled_in_and_the_rest_kept() {
        let request = pb::RenewLeaseRequest {
            cell_id: String::new(),
            lease_id: "0b6a4cf6-3f5e-4a47-9c1e-2b8c2d9a7e10".into(),
        };
        let body = with_cell_id(&framed(&request), "cell-a").unwrap();
        let decoded = pb::RenewLeaseRequest::decode(first_message(&body).unwrap()).unwrap();
        assert_eq!(decoded.cell_id, "cell-a");
        assert_eq!(decoded.lease_id, request.lease_id);
    }
}
