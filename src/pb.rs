//! The generated protobuf messages of `topology.claims.v1`: the public contract, shared by the
//! stored lease payload ([`codec`](crate::codec)) and, through `topology-claims-proto`, by the
//! client and the server. The tonic service stubs are in `topology-claims-proto`.
#![allow(clippy::all, missing_docs)]

include!(concat!(env!("OUT_DIR"), "/topology.claims.v1.rs"));

/// A StreamClaims request is a ListClaims request (same fields, same numbers): it is validated,
/// and each of its ranges computed, exactly as a ListClaims page.
impl From<StreamClaimsRequest> for ListClaimsRequest {
    fn from(r: StreamClaimsRequest) -> Self {
        Self {
            cell_id: r.cell_id,
            table_name: r.table_name,
            cursor: r.cursor,
            limit: r.limit,
            cursor_key: r.cursor_key,
            page_token: r.page_token,
            page_tokens: r.page_tokens,
            source_table: r.source_table,
        }
    }
}

impl From<ListClaimsRequest> for StreamClaimsRequest {
    fn from(r: ListClaimsRequest) -> Self {
        Self {
            cell_id: r.cell_id,
            table_name: r.table_name,
            cursor: r.cursor,
            limit: r.limit,
            cursor_key: r.cursor_key,
            page_token: r.page_token,
            page_tokens: r.page_tokens,
            source_table: r.source_table,
        }
    }
}

/// A StreamClaims range is a ListClaims page, field for field.
impl From<ListClaimsResponse> for ClaimsRange {
    fn from(page: ListClaimsResponse) -> Self {
        Self {
            claims: page.claims,
            start_range: page.start_range,
            end_range: page.end_range,
            next_cursor: page.next_cursor,
            next_cursor_key: page.next_cursor_key,
            next_page_token: page.next_page_token,
        }
    }
}

impl From<ClaimsRange> for ListClaimsResponse {
    fn from(range: ClaimsRange) -> Self {
        Self {
            claims: range.claims,
            start_range: range.start_range,
            end_range: range.end_range,
            next_cursor: range.next_cursor,
            next_cursor_key: range.next_cursor_key,
            next_page_token: range.next_page_token,
        }
    }
}

/// `topology.claims.admin.v1`: the messages of the administrative contract.
pub mod admin {
    #![allow(clippy::all, missing_docs)]
    include!(concat!(
        env!("OUT_DIR"),
        "/admin/topology.claims.admin.v1.rs"
    ));
}
