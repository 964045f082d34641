//! Recorded `/metrics` of two node proxies, scraped twice 10 s apart, for the tests of
//! `ambit stat` and `ambit edges` — and the traffic that produced them, replayed through
//! `prometheus-client` with the node proxy's label sets and buckets, to prove the recording
//! is exactly what the proxy's encoder writes (`recording_is_what_the_encoder_writes`; to
//! record again: `cargo test -p ambit-cli print_recording -- --ignored --nocapture`).
//!
//! The mesh (namespace `shop`, trust domain `cluster.local`, ServiceAccounts named after
//! their workloads):
//!
//! - node a: `web-0` (workload `web`), `api-0` (`api`); node b: `api-1` (`api`), `load-0`
//!   (`load`).
//! - `load` → Service `web.shop` (HTTP, mTLS); `web` → Service `api.shop` (HTTP, mTLS,
//!   balanced over `api-0` and `api-1`); `web` → Service `db.data` (opaque TCP, outside the
//!   mesh); a client outside the mesh → `api-0` (plaintext TCP on 4144).
//!
//! In the 10 s between the scrapes (the numbers the tests check):
//!
//! | series | requests | success | failure | latency, ms (observations) |
//! |---|---|---|---|---|
//! | web-0 inbound from load | +200 | +190 (200) | +10 (500) | 60 in (4,5], 80 in (5,10], 50 in (10,20], 10 in (20,30] |
//! | web-0 outbound to api | +400 | +396 | +4 (503) | 200 in (1,2], 200 in (2,3] |
//! | api-0 inbound from web | +300 | +297 | +3 (503) | 300 in (1,2] |
//! | api-1 inbound from web | +100 | +99 | +1 (503) | 100 in (2,3] |
//! | load-0 outbound to web | +200 | +190 | +10 (500) | 100 in (5,10], 80 in (10,20], 20 in (20,30] |
//!
//! TCP: web-0 → db: +2 opened, +2 closed, 1 open, +2000 bytes read, +200 written;
//! api-0 plaintext inbound: +2 opened, +1 closed, 3 open (2 before), +200 read, +4000
//! written.

/// Node a, first scrape.
pub const A1: &str = r#"# HELP identity_cert_expiration_timestamp_seconds notAfter of the current workload certificate, seconds since the Unix epoch.
# TYPE identity_cert_expiration_timestamp_seconds gauge
identity_cert_expiration_timestamp_seconds{identity="spiffe://cluster.local/ns/shop/sa/api"} 1900000000
identity_cert_expiration_timestamp_seconds{identity="spiffe://cluster.local/ns/shop/sa/web"} 1900000000
# HELP tcp_open TCP connections opened.
# TYPE tcp_open counter
tcp_open_total{direction="inbound",namespace="shop",pod="api-0",workload="api",client_id="",server_id="",dst_service="",tls="no_identity"} 5
tcp_open_total{direction="outbound",namespace="shop",pod="web-0",workload="web",client_id="",server_id="",dst_service="db.data",tls="no_identity"} 10
# HELP tcp_close TCP connections closed.
# TYPE tcp_close counter
tcp_close_total{direction="outbound",namespace="shop",pod="web-0",workload="web",client_id="",server_id="",dst_service="db.data",tls="no_identity"} 9
tcp_close_total{direction="inbound",namespace="shop",pod="api-0",workload="api",client_id="",server_id="",dst_service="",tls="no_identity"} 3
# HELP tcp_open_connections TCP connections open now.
# TYPE tcp_open_connections gauge
tcp_open_connections{direction="inbound",namespace="shop",pod="api-0",workload="api",client_id="",server_id="",dst_service="",tls="no_identity"} 2
tcp_open_connections{direction="outbound",namespace="shop",pod="web-0",workload="web",client_id="",server_id="",dst_service="db.data",tls="no_identity"} 1
# HELP tcp_read_bytes Bytes read from the connection's client side.
# TYPE tcp_read_bytes counter
tcp_read_bytes_total{direction="outbound",namespace="shop",pod="web-0",workload="web",client_id="",server_id="",dst_service="db.data",tls="no_identity"} 9000
tcp_read_bytes_total{direction="inbound",namespace="shop",pod="api-0",workload="api",client_id="",server_id="",dst_service="",tls="no_identity"} 100
# HELP tcp_write_bytes Bytes written to the connection's client side.
# TYPE tcp_write_bytes counter
tcp_write_bytes_total{direction="outbound",namespace="shop",pod="web-0",workload="web",client_id="",server_id="",dst_service="db.data",tls="no_identity"} 900
tcp_write_bytes_total{direction="inbound",namespace="shop",pod="api-0",workload="api",client_id="",server_id="",dst_service="",tls="no_identity"} 1000
# HELP tcp_errors Connections that failed, by cause.
# TYPE tcp_errors counter
tcp_errors_total{direction="inbound",error="client"} 1
# HELP request HTTP requests.
# TYPE request counter
request_total{direction="outbound",namespace="shop",pod="web-0",workload="web",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/api",dst_service="api.shop",tls="true"} 2000
request_total{direction="inbound",namespace="shop",pod="web-0",workload="web",client_id="spiffe://cluster.local/ns/shop/sa/load",server_id="",dst_service="",tls="true"} 1000
request_total{direction="inbound",namespace="shop",pod="api-0",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 3000
# HELP response HTTP responses, by status, classification and gRPC status.
# TYPE response counter
response_total{direction="outbound",namespace="shop",pod="web-0",workload="web",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/api",dst_service="api.shop",tls="true",status_code="503",classification="failure",grpc_status=""} 4
response_total{direction="inbound",namespace="shop",pod="api-0",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true",status_code="503",classification="failure",grpc_status=""} 3
response_total{direction="inbound",namespace="shop",pod="api-0",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true",status_code="200",classification="success",grpc_status=""} 2997
response_total{direction="inbound",namespace="shop",pod="web-0",workload="web",client_id="spiffe://cluster.local/ns/shop/sa/load",server_id="",dst_service="",tls="true",status_code="200",classification="success",grpc_status=""} 990
response_total{direction="inbound",namespace="shop",pod="web-0",workload="web",client_id="spiffe://cluster.local/ns/shop/sa/load",server_id="",dst_service="",tls="true",status_code="500",classification="failure",grpc_status=""} 10
response_total{direction="outbound",namespace="shop",pod="web-0",workload="web",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/api",dst_service="api.shop",tls="true",status_code="200",classification="success",grpc_status=""} 1996
# HELP response_latency_ms Time to response headers, in milliseconds.
# TYPE response_latency_ms histogram
response_latency_ms_sum{direction="inbound",namespace="shop",pod="api-0",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 3500.0
response_latency_ms_count{direction="inbound",namespace="shop",pod="api-0",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 3000
response_latency_ms_bucket{le="1.0",direction="inbound",namespace="shop",pod="api-0",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 1000
response_latency_ms_bucket{le="2.0",direction="inbound",namespace="shop",pod="api-0",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 3000
response_latency_ms_bucket{le="3.0",direction="inbound",namespace="shop",pod="api-0",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 3000
response_latency_ms_bucket{le="4.0",direction="inbound",namespace="shop",pod="api-0",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 3000
response_latency_ms_bucket{le="5.0",direction="inbound",namespace="shop",pod="api-0",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 3000
response_latency_ms_bucket{le="10.0",direction="inbound",namespace="shop",pod="api-0",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 3000
response_latency_ms_bucket{le="20.0",direction="inbound",namespace="shop",pod="api-0",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 3000
response_latency_ms_bucket{le="30.0",direction="inbound",namespace="shop",pod="api-0",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 3000
response_latency_ms_bucket{le="40.0",direction="inbound",namespace="shop",pod="api-0",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 3000
response_latency_ms_bucket{le="50.0",direction="inbound",namespace="shop",pod="api-0",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 3000
response_latency_ms_bucket{le="100.0",direction="inbound",namespace="shop",pod="api-0",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 3000
response_latency_ms_bucket{le="200.0",direction="inbound",namespace="shop",pod="api-0",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 3000
response_latency_ms_bucket{le="300.0",direction="inbound",namespace="shop",pod="api-0",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 3000
response_latency_ms_bucket{le="400.0",direction="inbound",namespace="shop",pod="api-0",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 3000
response_latency_ms_bucket{le="500.0",direction="inbound",namespace="shop",pod="api-0",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 3000
response_latency_ms_bucket{le="1000.0",direction="inbound",namespace="shop",pod="api-0",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 3000
response_latency_ms_bucket{le="2000.0",direction="inbound",namespace="shop",pod="api-0",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 3000
response_latency_ms_bucket{le="3000.0",direction="inbound",namespace="shop",pod="api-0",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 3000
response_latency_ms_bucket{le="4000.0",direction="inbound",namespace="shop",pod="api-0",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 3000
response_latency_ms_bucket{le="5000.0",direction="inbound",namespace="shop",pod="api-0",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 3000
response_latency_ms_bucket{le="10000.0",direction="inbound",namespace="shop",pod="api-0",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 3000
response_latency_ms_bucket{le="20000.0",direction="inbound",namespace="shop",pod="api-0",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 3000
response_latency_ms_bucket{le="30000.0",direction="inbound",namespace="shop",pod="api-0",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 3000
response_latency_ms_bucket{le="40000.0",direction="inbound",namespace="shop",pod="api-0",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 3000
response_latency_ms_bucket{le="50000.0",direction="inbound",namespace="shop",pod="api-0",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 3000
response_latency_ms_bucket{le="+Inf",direction="inbound",namespace="shop",pod="api-0",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 3000
response_latency_ms_sum{direction="inbound",namespace="shop",pod="web-0",workload="web",client_id="spiffe://cluster.local/ns/shop/sa/load",server_id="",dst_service="",tls="true"} 6550.0
response_latency_ms_count{direction="inbound",namespace="shop",pod="web-0",workload="web",client_id="spiffe://cluster.local/ns/shop/sa/load",server_id="",dst_service="",tls="true"} 1000
response_latency_ms_bucket{le="1.0",direction="inbound",namespace="shop",pod="web-0",workload="web",client_id="spiffe://cluster.local/ns/shop/sa/load",server_id="",dst_service="",tls="true"} 0
response_latency_ms_bucket{le="2.0",direction="inbound",namespace="shop",pod="web-0",workload="web",client_id="spiffe://cluster.local/ns/shop/sa/load",server_id="",dst_service="",tls="true"} 0
response_latency_ms_bucket{le="3.0",direction="inbound",namespace="shop",pod="web-0",workload="web",client_id="spiffe://cluster.local/ns/shop/sa/load",server_id="",dst_service="",tls="true"} 0
response_latency_ms_bucket{le="4.0",direction="inbound",namespace="shop",pod="web-0",workload="web",client_id="spiffe://cluster.local/ns/shop/sa/load",server_id="",dst_service="",tls="true"} 0
response_latency_ms_bucket{le="5.0",direction="inbound",namespace="shop",pod="web-0",workload="web",client_id="spiffe://cluster.local/ns/shop/sa/load",server_id="",dst_service="",tls="true"} 500
response_latency_ms_bucket{le="10.0",direction="inbound",namespace="shop",pod="web-0",workload="web",client_id="spiffe://cluster.local/ns/shop/sa/load",server_id="",dst_service="",tls="true"} 900
response_latency_ms_bucket{le="20.0",direction="inbound",namespace="shop",pod="web-0",workload="web",client_id="spiffe://cluster.local/ns/shop/sa/load",server_id="",dst_service="",tls="true"} 1000
response_latency_ms_bucket{le="30.0",direction="inbound",namespace="shop",pod="web-0",workload="web",client_id="spiffe://cluster.local/ns/shop/sa/load",server_id="",dst_service="",tls="true"} 1000
response_latency_ms_bucket{le="40.0",direction="inbound",namespace="shop",pod="web-0",workload="web",client_id="spiffe://cluster.local/ns/shop/sa/load",server_id="",dst_service="",tls="true"} 1000
response_latency_ms_bucket{le="50.0",direction="inbound",namespace="shop",pod="web-0",workload="web",client_id="spiffe://cluster.local/ns/shop/sa/load",server_id="",dst_service="",tls="true"} 1000
response_latency_ms_bucket{le="100.0",direction="inbound",namespace="shop",pod="web-0",workload="web",client_id="spiffe://cluster.local/ns/shop/sa/load",server_id="",dst_service="",tls="true"} 1000
response_latency_ms_bucket{le="200.0",direction="inbound",namespace="shop",pod="web-0",workload="web",client_id="spiffe://cluster.local/ns/shop/sa/load",server_id="",dst_service="",tls="true"} 1000
response_latency_ms_bucket{le="300.0",direction="inbound",namespace="shop",pod="web-0",workload="web",client_id="spiffe://cluster.local/ns/shop/sa/load",server_id="",dst_service="",tls="true"} 1000
response_latency_ms_bucket{le="400.0",direction="inbound",namespace="shop",pod="web-0",workload="web",client_id="spiffe://cluster.local/ns/shop/sa/load",server_id="",dst_service="",tls="true"} 1000
response_latency_ms_bucket{le="500.0",direction="inbound",namespace="shop",pod="web-0",workload="web",client_id="spiffe://cluster.local/ns/shop/sa/load",server_id="",dst_service="",tls="true"} 1000
response_latency_ms_bucket{le="1000.0",direction="inbound",namespace="shop",pod="web-0",workload="web",client_id="spiffe://cluster.local/ns/shop/sa/load",server_id="",dst_service="",tls="true"} 1000
response_latency_ms_bucket{le="2000.0",direction="inbound",namespace="shop",pod="web-0",workload="web",client_id="spiffe://cluster.local/ns/shop/sa/load",server_id="",dst_service="",tls="true"} 1000
response_latency_ms_bucket{le="3000.0",direction="inbound",namespace="shop",pod="web-0",workload="web",client_id="spiffe://cluster.local/ns/shop/sa/load",server_id="",dst_service="",tls="true"} 1000
response_latency_ms_bucket{le="4000.0",direction="inbound",namespace="shop",pod="web-0",workload="web",client_id="spiffe://cluster.local/ns/shop/sa/load",server_id="",dst_service="",tls="true"} 1000
response_latency_ms_bucket{le="5000.0",direction="inbound",namespace="shop",pod="web-0",workload="web",client_id="spiffe://cluster.local/ns/shop/sa/load",server_id="",dst_service="",tls="true"} 1000
response_latency_ms_bucket{le="10000.0",direction="inbound",namespace="shop",pod="web-0",workload="web",client_id="spiffe://cluster.local/ns/shop/sa/load",server_id="",dst_service="",tls="true"} 1000
response_latency_ms_bucket{le="20000.0",direction="inbound",namespace="shop",pod="web-0",workload="web",client_id="spiffe://cluster.local/ns/shop/sa/load",server_id="",dst_service="",tls="true"} 1000
response_latency_ms_bucket{le="30000.0",direction="inbound",namespace="shop",pod="web-0",workload="web",client_id="spiffe://cluster.local/ns/shop/sa/load",server_id="",dst_service="",tls="true"} 1000
response_latency_ms_bucket{le="40000.0",direction="inbound",namespace="shop",pod="web-0",workload="web",client_id="spiffe://cluster.local/ns/shop/sa/load",server_id="",dst_service="",tls="true"} 1000
response_latency_ms_bucket{le="50000.0",direction="inbound",namespace="shop",pod="web-0",workload="web",client_id="spiffe://cluster.local/ns/shop/sa/load",server_id="",dst_service="",tls="true"} 1000
response_latency_ms_bucket{le="+Inf",direction="inbound",namespace="shop",pod="web-0",workload="web",client_id="spiffe://cluster.local/ns/shop/sa/load",server_id="",dst_service="",tls="true"} 1000
response_latency_ms_sum{direction="outbound",namespace="shop",pod="web-0",workload="web",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/api",dst_service="api.shop",tls="true"} 2000.0
response_latency_ms_count{direction="outbound",namespace="shop",pod="web-0",workload="web",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/api",dst_service="api.shop",tls="true"} 2000
response_latency_ms_bucket{le="1.0",direction="outbound",namespace="shop",pod="web-0",workload="web",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/api",dst_service="api.shop",tls="true"} 1000
response_latency_ms_bucket{le="2.0",direction="outbound",namespace="shop",pod="web-0",workload="web",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/api",dst_service="api.shop",tls="true"} 2000
response_latency_ms_bucket{le="3.0",direction="outbound",namespace="shop",pod="web-0",workload="web",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/api",dst_service="api.shop",tls="true"} 2000
response_latency_ms_bucket{le="4.0",direction="outbound",namespace="shop",pod="web-0",workload="web",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/api",dst_service="api.shop",tls="true"} 2000
response_latency_ms_bucket{le="5.0",direction="outbound",namespace="shop",pod="web-0",workload="web",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/api",dst_service="api.shop",tls="true"} 2000
response_latency_ms_bucket{le="10.0",direction="outbound",namespace="shop",pod="web-0",workload="web",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/api",dst_service="api.shop",tls="true"} 2000
response_latency_ms_bucket{le="20.0",direction="outbound",namespace="shop",pod="web-0",workload="web",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/api",dst_service="api.shop",tls="true"} 2000
response_latency_ms_bucket{le="30.0",direction="outbound",namespace="shop",pod="web-0",workload="web",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/api",dst_service="api.shop",tls="true"} 2000
response_latency_ms_bucket{le="40.0",direction="outbound",namespace="shop",pod="web-0",workload="web",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/api",dst_service="api.shop",tls="true"} 2000
response_latency_ms_bucket{le="50.0",direction="outbound",namespace="shop",pod="web-0",workload="web",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/api",dst_service="api.shop",tls="true"} 2000
response_latency_ms_bucket{le="100.0",direction="outbound",namespace="shop",pod="web-0",workload="web",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/api",dst_service="api.shop",tls="true"} 2000
response_latency_ms_bucket{le="200.0",direction="outbound",namespace="shop",pod="web-0",workload="web",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/api",dst_service="api.shop",tls="true"} 2000
response_latency_ms_bucket{le="300.0",direction="outbound",namespace="shop",pod="web-0",workload="web",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/api",dst_service="api.shop",tls="true"} 2000
response_latency_ms_bucket{le="400.0",direction="outbound",namespace="shop",pod="web-0",workload="web",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/api",dst_service="api.shop",tls="true"} 2000
response_latency_ms_bucket{le="500.0",direction="outbound",namespace="shop",pod="web-0",workload="web",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/api",dst_service="api.shop",tls="true"} 2000
response_latency_ms_bucket{le="1000.0",direction="outbound",namespace="shop",pod="web-0",workload="web",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/api",dst_service="api.shop",tls="true"} 2000
response_latency_ms_bucket{le="2000.0",direction="outbound",namespace="shop",pod="web-0",workload="web",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/api",dst_service="api.shop",tls="true"} 2000
response_latency_ms_bucket{le="3000.0",direction="outbound",namespace="shop",pod="web-0",workload="web",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/api",dst_service="api.shop",tls="true"} 2000
response_latency_ms_bucket{le="4000.0",direction="outbound",namespace="shop",pod="web-0",workload="web",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/api",dst_service="api.shop",tls="true"} 2000
response_latency_ms_bucket{le="5000.0",direction="outbound",namespace="shop",pod="web-0",workload="web",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/api",dst_service="api.shop",tls="true"} 2000
response_latency_ms_bucket{le="10000.0",direction="outbound",namespace="shop",pod="web-0",workload="web",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/api",dst_service="api.shop",tls="true"} 2000
response_latency_ms_bucket{le="20000.0",direction="outbound",namespace="shop",pod="web-0",workload="web",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/api",dst_service="api.shop",tls="true"} 2000
response_latency_ms_bucket{le="30000.0",direction="outbound",namespace="shop",pod="web-0",workload="web",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/api",dst_service="api.shop",tls="true"} 2000
response_latency_ms_bucket{le="40000.0",direction="outbound",namespace="shop",pod="web-0",workload="web",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/api",dst_service="api.shop",tls="true"} 2000
response_latency_ms_bucket{le="50000.0",direction="outbound",namespace="shop",pod="web-0",workload="web",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/api",dst_service="api.shop",tls="true"} 2000
response_latency_ms_bucket{le="+Inf",direction="outbound",namespace="shop",pod="web-0",workload="web",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/api",dst_service="api.shop",tls="true"} 2000
# EOF
"#;
/// Node a, 10 s later.
pub const A2: &str = r#"# HELP identity_cert_expiration_timestamp_seconds notAfter of the current workload certificate, seconds since the Unix epoch.
# TYPE identity_cert_expiration_timestamp_seconds gauge
identity_cert_expiration_timestamp_seconds{identity="spiffe://cluster.local/ns/shop/sa/api"} 1900000000
identity_cert_expiration_timestamp_seconds{identity="spiffe://cluster.local/ns/shop/sa/web"} 1900000000
# HELP tcp_open TCP connections opened.
# TYPE tcp_open counter
tcp_open_total{direction="inbound",namespace="shop",pod="api-0",workload="api",client_id="",server_id="",dst_service="",tls="no_identity"} 7
tcp_open_total{direction="outbound",namespace="shop",pod="web-0",workload="web",client_id="",server_id="",dst_service="db.data",tls="no_identity"} 12
# HELP tcp_close TCP connections closed.
# TYPE tcp_close counter
tcp_close_total{direction="outbound",namespace="shop",pod="web-0",workload="web",client_id="",server_id="",dst_service="db.data",tls="no_identity"} 11
tcp_close_total{direction="inbound",namespace="shop",pod="api-0",workload="api",client_id="",server_id="",dst_service="",tls="no_identity"} 4
# HELP tcp_open_connections TCP connections open now.
# TYPE tcp_open_connections gauge
tcp_open_connections{direction="inbound",namespace="shop",pod="api-0",workload="api",client_id="",server_id="",dst_service="",tls="no_identity"} 3
tcp_open_connections{direction="outbound",namespace="shop",pod="web-0",workload="web",client_id="",server_id="",dst_service="db.data",tls="no_identity"} 1
# HELP tcp_read_bytes Bytes read from the connection's client side.
# TYPE tcp_read_bytes counter
tcp_read_bytes_total{direction="outbound",namespace="shop",pod="web-0",workload="web",client_id="",server_id="",dst_service="db.data",tls="no_identity"} 11000
tcp_read_bytes_total{direction="inbound",namespace="shop",pod="api-0",workload="api",client_id="",server_id="",dst_service="",tls="no_identity"} 300
# HELP tcp_write_bytes Bytes written to the connection's client side.
# TYPE tcp_write_bytes counter
tcp_write_bytes_total{direction="outbound",namespace="shop",pod="web-0",workload="web",client_id="",server_id="",dst_service="db.data",tls="no_identity"} 1100
tcp_write_bytes_total{direction="inbound",namespace="shop",pod="api-0",workload="api",client_id="",server_id="",dst_service="",tls="no_identity"} 5000
# HELP tcp_errors Connections that failed, by cause.
# TYPE tcp_errors counter
tcp_errors_total{direction="inbound",error="client"} 1
# HELP request HTTP requests.
# TYPE request counter
request_total{direction="outbound",namespace="shop",pod="web-0",workload="web",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/api",dst_service="api.shop",tls="true"} 2400
request_total{direction="inbound",namespace="shop",pod="web-0",workload="web",client_id="spiffe://cluster.local/ns/shop/sa/load",server_id="",dst_service="",tls="true"} 1200
request_total{direction="inbound",namespace="shop",pod="api-0",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 3300
# HELP response HTTP responses, by status, classification and gRPC status.
# TYPE response counter
response_total{direction="outbound",namespace="shop",pod="web-0",workload="web",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/api",dst_service="api.shop",tls="true",status_code="503",classification="failure",grpc_status=""} 8
response_total{direction="inbound",namespace="shop",pod="api-0",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true",status_code="503",classification="failure",grpc_status=""} 6
response_total{direction="inbound",namespace="shop",pod="api-0",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true",status_code="200",classification="success",grpc_status=""} 3294
response_total{direction="inbound",namespace="shop",pod="web-0",workload="web",client_id="spiffe://cluster.local/ns/shop/sa/load",server_id="",dst_service="",tls="true",status_code="200",classification="success",grpc_status=""} 1180
response_total{direction="inbound",namespace="shop",pod="web-0",workload="web",client_id="spiffe://cluster.local/ns/shop/sa/load",server_id="",dst_service="",tls="true",status_code="500",classification="failure",grpc_status=""} 20
response_total{direction="outbound",namespace="shop",pod="web-0",workload="web",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/api",dst_service="api.shop",tls="true",status_code="200",classification="success",grpc_status=""} 2392
# HELP response_latency_ms Time to response headers, in milliseconds.
# TYPE response_latency_ms histogram
response_latency_ms_sum{direction="inbound",namespace="shop",pod="api-0",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 3950.0
response_latency_ms_count{direction="inbound",namespace="shop",pod="api-0",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 3300
response_latency_ms_bucket{le="1.0",direction="inbound",namespace="shop",pod="api-0",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 1000
response_latency_ms_bucket{le="2.0",direction="inbound",namespace="shop",pod="api-0",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 3300
response_latency_ms_bucket{le="3.0",direction="inbound",namespace="shop",pod="api-0",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 3300
response_latency_ms_bucket{le="4.0",direction="inbound",namespace="shop",pod="api-0",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 3300
response_latency_ms_bucket{le="5.0",direction="inbound",namespace="shop",pod="api-0",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 3300
response_latency_ms_bucket{le="10.0",direction="inbound",namespace="shop",pod="api-0",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 3300
response_latency_ms_bucket{le="20.0",direction="inbound",namespace="shop",pod="api-0",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 3300
response_latency_ms_bucket{le="30.0",direction="inbound",namespace="shop",pod="api-0",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 3300
response_latency_ms_bucket{le="40.0",direction="inbound",namespace="shop",pod="api-0",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 3300
response_latency_ms_bucket{le="50.0",direction="inbound",namespace="shop",pod="api-0",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 3300
response_latency_ms_bucket{le="100.0",direction="inbound",namespace="shop",pod="api-0",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 3300
response_latency_ms_bucket{le="200.0",direction="inbound",namespace="shop",pod="api-0",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 3300
response_latency_ms_bucket{le="300.0",direction="inbound",namespace="shop",pod="api-0",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 3300
response_latency_ms_bucket{le="400.0",direction="inbound",namespace="shop",pod="api-0",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 3300
response_latency_ms_bucket{le="500.0",direction="inbound",namespace="shop",pod="api-0",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 3300
response_latency_ms_bucket{le="1000.0",direction="inbound",namespace="shop",pod="api-0",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 3300
response_latency_ms_bucket{le="2000.0",direction="inbound",namespace="shop",pod="api-0",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 3300
response_latency_ms_bucket{le="3000.0",direction="inbound",namespace="shop",pod="api-0",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 3300
response_latency_ms_bucket{le="4000.0",direction="inbound",namespace="shop",pod="api-0",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 3300
response_latency_ms_bucket{le="5000.0",direction="inbound",namespace="shop",pod="api-0",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 3300
response_latency_ms_bucket{le="10000.0",direction="inbound",namespace="shop",pod="api-0",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 3300
response_latency_ms_bucket{le="20000.0",direction="inbound",namespace="shop",pod="api-0",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 3300
response_latency_ms_bucket{le="30000.0",direction="inbound",namespace="shop",pod="api-0",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 3300
response_latency_ms_bucket{le="40000.0",direction="inbound",namespace="shop",pod="api-0",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 3300
response_latency_ms_bucket{le="50000.0",direction="inbound",namespace="shop",pod="api-0",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 3300
response_latency_ms_bucket{le="+Inf",direction="inbound",namespace="shop",pod="api-0",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 3300
response_latency_ms_sum{direction="inbound",namespace="shop",pod="web-0",workload="web",client_id="spiffe://cluster.local/ns/shop/sa/load",server_id="",dst_service="",tls="true"} 8380.0
response_latency_ms_count{direction="inbound",namespace="shop",pod="web-0",workload="web",client_id="spiffe://cluster.local/ns/shop/sa/load",server_id="",dst_service="",tls="true"} 1200
response_latency_ms_bucket{le="1.0",direction="inbound",namespace="shop",pod="web-0",workload="web",client_id="spiffe://cluster.local/ns/shop/sa/load",server_id="",dst_service="",tls="true"} 0
response_latency_ms_bucket{le="2.0",direction="inbound",namespace="shop",pod="web-0",workload="web",client_id="spiffe://cluster.local/ns/shop/sa/load",server_id="",dst_service="",tls="true"} 0
response_latency_ms_bucket{le="3.0",direction="inbound",namespace="shop",pod="web-0",workload="web",client_id="spiffe://cluster.local/ns/shop/sa/load",server_id="",dst_service="",tls="true"} 0
response_latency_ms_bucket{le="4.0",direction="inbound",namespace="shop",pod="web-0",workload="web",client_id="spiffe://cluster.local/ns/shop/sa/load",server_id="",dst_service="",tls="true"} 0
response_latency_ms_bucket{le="5.0",direction="inbound",namespace="shop",pod="web-0",workload="web",client_id="spiffe://cluster.local/ns/shop/sa/load",server_id="",dst_service="",tls="true"} 560
response_latency_ms_bucket{le="10.0",direction="inbound",namespace="shop",pod="web-0",workload="web",client_id="spiffe://cluster.local/ns/shop/sa/load",server_id="",dst_service="",tls="true"} 1040
response_latency_ms_bucket{le="20.0",direction="inbound",namespace="shop",pod="web-0",workload="web",client_id="spiffe://cluster.local/ns/shop/sa/load",server_id="",dst_service="",tls="true"} 1190
response_latency_ms_bucket{le="30.0",direction="inbound",namespace="shop",pod="web-0",workload="web",client_id="spiffe://cluster.local/ns/shop/sa/load",server_id="",dst_service="",tls="true"} 1200
response_latency_ms_bucket{le="40.0",direction="inbound",namespace="shop",pod="web-0",workload="web",client_id="spiffe://cluster.local/ns/shop/sa/load",server_id="",dst_service="",tls="true"} 1200
response_latency_ms_bucket{le="50.0",direction="inbound",namespace="shop",pod="web-0",workload="web",client_id="spiffe://cluster.local/ns/shop/sa/load",server_id="",dst_service="",tls="true"} 1200
response_latency_ms_bucket{le="100.0",direction="inbound",namespace="shop",pod="web-0",workload="web",client_id="spiffe://cluster.local/ns/shop/sa/load",server_id="",dst_service="",tls="true"} 1200
response_latency_ms_bucket{le="200.0",direction="inbound",namespace="shop",pod="web-0",workload="web",client_id="spiffe://cluster.local/ns/shop/sa/load",server_id="",dst_service="",tls="true"} 1200
response_latency_ms_bucket{le="300.0",direction="inbound",namespace="shop",pod="web-0",workload="web",client_id="spiffe://cluster.local/ns/shop/sa/load",server_id="",dst_service="",tls="true"} 1200
response_latency_ms_bucket{le="400.0",direction="inbound",namespace="shop",pod="web-0",workload="web",client_id="spiffe://cluster.local/ns/shop/sa/load",server_id="",dst_service="",tls="true"} 1200
response_latency_ms_bucket{le="500.0",direction="inbound",namespace="shop",pod="web-0",workload="web",client_id="spiffe://cluster.local/ns/shop/sa/load",server_id="",dst_service="",tls="true"} 1200
response_latency_ms_bucket{le="1000.0",direction="inbound",namespace="shop",pod="web-0",workload="web",client_id="spiffe://cluster.local/ns/shop/sa/load",server_id="",dst_service="",tls="true"} 1200
response_latency_ms_bucket{le="2000.0",direction="inbound",namespace="shop",pod="web-0",workload="web",client_id="spiffe://cluster.local/ns/shop/sa/load",server_id="",dst_service="",tls="true"} 1200
response_latency_ms_bucket{le="3000.0",direction="inbound",namespace="shop",pod="web-0",workload="web",client_id="spiffe://cluster.local/ns/shop/sa/load",server_id="",dst_service="",tls="true"} 1200
response_latency_ms_bucket{le="4000.0",direction="inbound",namespace="shop",pod="web-0",workload="web",client_id="spiffe://cluster.local/ns/shop/sa/load",server_id="",dst_service="",tls="true"} 1200
response_latency_ms_bucket{le="5000.0",direction="inbound",namespace="shop",pod="web-0",workload="web",client_id="spiffe://cluster.local/ns/shop/sa/load",server_id="",dst_service="",tls="true"} 1200
response_latency_ms_bucket{le="10000.0",direction="inbound",namespace="shop",pod="web-0",workload="web",client_id="spiffe://cluster.local/ns/shop/sa/load",server_id="",dst_service="",tls="true"} 1200
response_latency_ms_bucket{le="20000.0",direction="inbound",namespace="shop",pod="web-0",workload="web",client_id="spiffe://cluster.local/ns/shop/sa/load",server_id="",dst_service="",tls="true"} 1200
response_latency_ms_bucket{le="30000.0",direction="inbound",namespace="shop",pod="web-0",workload="web",client_id="spiffe://cluster.local/ns/shop/sa/load",server_id="",dst_service="",tls="true"} 1200
response_latency_ms_bucket{le="40000.0",direction="inbound",namespace="shop",pod="web-0",workload="web",client_id="spiffe://cluster.local/ns/shop/sa/load",server_id="",dst_service="",tls="true"} 1200
response_latency_ms_bucket{le="50000.0",direction="inbound",namespace="shop",pod="web-0",workload="web",client_id="spiffe://cluster.local/ns/shop/sa/load",server_id="",dst_service="",tls="true"} 1200
response_latency_ms_bucket{le="+Inf",direction="inbound",namespace="shop",pod="web-0",workload="web",client_id="spiffe://cluster.local/ns/shop/sa/load",server_id="",dst_service="",tls="true"} 1200
response_latency_ms_sum{direction="outbound",namespace="shop",pod="web-0",workload="web",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/api",dst_service="api.shop",tls="true"} 2800.0
response_latency_ms_count{direction="outbound",namespace="shop",pod="web-0",workload="web",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/api",dst_service="api.shop",tls="true"} 2400
response_latency_ms_bucket{le="1.0",direction="outbound",namespace="shop",pod="web-0",workload="web",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/api",dst_service="api.shop",tls="true"} 1000
response_latency_ms_bucket{le="2.0",direction="outbound",namespace="shop",pod="web-0",workload="web",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/api",dst_service="api.shop",tls="true"} 2200
response_latency_ms_bucket{le="3.0",direction="outbound",namespace="shop",pod="web-0",workload="web",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/api",dst_service="api.shop",tls="true"} 2400
response_latency_ms_bucket{le="4.0",direction="outbound",namespace="shop",pod="web-0",workload="web",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/api",dst_service="api.shop",tls="true"} 2400
response_latency_ms_bucket{le="5.0",direction="outbound",namespace="shop",pod="web-0",workload="web",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/api",dst_service="api.shop",tls="true"} 2400
response_latency_ms_bucket{le="10.0",direction="outbound",namespace="shop",pod="web-0",workload="web",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/api",dst_service="api.shop",tls="true"} 2400
response_latency_ms_bucket{le="20.0",direction="outbound",namespace="shop",pod="web-0",workload="web",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/api",dst_service="api.shop",tls="true"} 2400
response_latency_ms_bucket{le="30.0",direction="outbound",namespace="shop",pod="web-0",workload="web",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/api",dst_service="api.shop",tls="true"} 2400
response_latency_ms_bucket{le="40.0",direction="outbound",namespace="shop",pod="web-0",workload="web",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/api",dst_service="api.shop",tls="true"} 2400
response_latency_ms_bucket{le="50.0",direction="outbound",namespace="shop",pod="web-0",workload="web",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/api",dst_service="api.shop",tls="true"} 2400
response_latency_ms_bucket{le="100.0",direction="outbound",namespace="shop",pod="web-0",workload="web",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/api",dst_service="api.shop",tls="true"} 2400
response_latency_ms_bucket{le="200.0",direction="outbound",namespace="shop",pod="web-0",workload="web",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/api",dst_service="api.shop",tls="true"} 2400
response_latency_ms_bucket{le="300.0",direction="outbound",namespace="shop",pod="web-0",workload="web",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/api",dst_service="api.shop",tls="true"} 2400
response_latency_ms_bucket{le="400.0",direction="outbound",namespace="shop",pod="web-0",workload="web",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/api",dst_service="api.shop",tls="true"} 2400
response_latency_ms_bucket{le="500.0",direction="outbound",namespace="shop",pod="web-0",workload="web",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/api",dst_service="api.shop",tls="true"} 2400
response_latency_ms_bucket{le="1000.0",direction="outbound",namespace="shop",pod="web-0",workload="web",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/api",dst_service="api.shop",tls="true"} 2400
response_latency_ms_bucket{le="2000.0",direction="outbound",namespace="shop",pod="web-0",workload="web",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/api",dst_service="api.shop",tls="true"} 2400
response_latency_ms_bucket{le="3000.0",direction="outbound",namespace="shop",pod="web-0",workload="web",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/api",dst_service="api.shop",tls="true"} 2400
response_latency_ms_bucket{le="4000.0",direction="outbound",namespace="shop",pod="web-0",workload="web",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/api",dst_service="api.shop",tls="true"} 2400
response_latency_ms_bucket{le="5000.0",direction="outbound",namespace="shop",pod="web-0",workload="web",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/api",dst_service="api.shop",tls="true"} 2400
response_latency_ms_bucket{le="10000.0",direction="outbound",namespace="shop",pod="web-0",workload="web",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/api",dst_service="api.shop",tls="true"} 2400
response_latency_ms_bucket{le="20000.0",direction="outbound",namespace="shop",pod="web-0",workload="web",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/api",dst_service="api.shop",tls="true"} 2400
response_latency_ms_bucket{le="30000.0",direction="outbound",namespace="shop",pod="web-0",workload="web",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/api",dst_service="api.shop",tls="true"} 2400
response_latency_ms_bucket{le="40000.0",direction="outbound",namespace="shop",pod="web-0",workload="web",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/api",dst_service="api.shop",tls="true"} 2400
response_latency_ms_bucket{le="50000.0",direction="outbound",namespace="shop",pod="web-0",workload="web",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/api",dst_service="api.shop",tls="true"} 2400
response_latency_ms_bucket{le="+Inf",direction="outbound",namespace="shop",pod="web-0",workload="web",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/api",dst_service="api.shop",tls="true"} 2400
# EOF
"#;
/// Node b, first scrape.
pub const B1: &str = r#"# HELP identity_cert_expiration_timestamp_seconds notAfter of the current workload certificate, seconds since the Unix epoch.
# TYPE identity_cert_expiration_timestamp_seconds gauge
identity_cert_expiration_timestamp_seconds{identity="spiffe://cluster.local/ns/shop/sa/api"} 1900000000
identity_cert_expiration_timestamp_seconds{identity="spiffe://cluster.local/ns/shop/sa/load"} 1900000000
# HELP request HTTP requests.
# TYPE request counter
request_total{direction="inbound",namespace="shop",pod="api-1",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 1000
request_total{direction="outbound",namespace="shop",pod="load-0",workload="load",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/web",dst_service="web.shop",tls="true"} 5000
# HELP response HTTP responses, by status, classification and gRPC status.
# TYPE response counter
response_total{direction="outbound",namespace="shop",pod="load-0",workload="load",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/web",dst_service="web.shop",tls="true",status_code="200",classification="success",grpc_status=""} 4990
response_total{direction="inbound",namespace="shop",pod="api-1",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true",status_code="200",classification="success",grpc_status=""} 999
response_total{direction="outbound",namespace="shop",pod="load-0",workload="load",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/web",dst_service="web.shop",tls="true",status_code="500",classification="failure",grpc_status=""} 10
response_total{direction="inbound",namespace="shop",pod="api-1",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true",status_code="503",classification="failure",grpc_status=""} 1
# HELP response_latency_ms Time to response headers, in milliseconds.
# TYPE response_latency_ms histogram
response_latency_ms_sum{direction="outbound",namespace="shop",pod="load-0",workload="load",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/web",dst_service="web.shop",tls="true"} 35000.0
response_latency_ms_count{direction="outbound",namespace="shop",pod="load-0",workload="load",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/web",dst_service="web.shop",tls="true"} 5000
response_latency_ms_bucket{le="1.0",direction="outbound",namespace="shop",pod="load-0",workload="load",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/web",dst_service="web.shop",tls="true"} 0
response_latency_ms_bucket{le="2.0",direction="outbound",namespace="shop",pod="load-0",workload="load",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/web",dst_service="web.shop",tls="true"} 0
response_latency_ms_bucket{le="3.0",direction="outbound",namespace="shop",pod="load-0",workload="load",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/web",dst_service="web.shop",tls="true"} 0
response_latency_ms_bucket{le="4.0",direction="outbound",namespace="shop",pod="load-0",workload="load",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/web",dst_service="web.shop",tls="true"} 0
response_latency_ms_bucket{le="5.0",direction="outbound",namespace="shop",pod="load-0",workload="load",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/web",dst_service="web.shop",tls="true"} 0
response_latency_ms_bucket{le="10.0",direction="outbound",namespace="shop",pod="load-0",workload="load",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/web",dst_service="web.shop",tls="true"} 5000
response_latency_ms_bucket{le="20.0",direction="outbound",namespace="shop",pod="load-0",workload="load",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/web",dst_service="web.shop",tls="true"} 5000
response_latency_ms_bucket{le="30.0",direction="outbound",namespace="shop",pod="load-0",workload="load",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/web",dst_service="web.shop",tls="true"} 5000
response_latency_ms_bucket{le="40.0",direction="outbound",namespace="shop",pod="load-0",workload="load",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/web",dst_service="web.shop",tls="true"} 5000
response_latency_ms_bucket{le="50.0",direction="outbound",namespace="shop",pod="load-0",workload="load",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/web",dst_service="web.shop",tls="true"} 5000
response_latency_ms_bucket{le="100.0",direction="outbound",namespace="shop",pod="load-0",workload="load",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/web",dst_service="web.shop",tls="true"} 5000
response_latency_ms_bucket{le="200.0",direction="outbound",namespace="shop",pod="load-0",workload="load",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/web",dst_service="web.shop",tls="true"} 5000
response_latency_ms_bucket{le="300.0",direction="outbound",namespace="shop",pod="load-0",workload="load",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/web",dst_service="web.shop",tls="true"} 5000
response_latency_ms_bucket{le="400.0",direction="outbound",namespace="shop",pod="load-0",workload="load",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/web",dst_service="web.shop",tls="true"} 5000
response_latency_ms_bucket{le="500.0",direction="outbound",namespace="shop",pod="load-0",workload="load",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/web",dst_service="web.shop",tls="true"} 5000
response_latency_ms_bucket{le="1000.0",direction="outbound",namespace="shop",pod="load-0",workload="load",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/web",dst_service="web.shop",tls="true"} 5000
response_latency_ms_bucket{le="2000.0",direction="outbound",namespace="shop",pod="load-0",workload="load",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/web",dst_service="web.shop",tls="true"} 5000
response_latency_ms_bucket{le="3000.0",direction="outbound",namespace="shop",pod="load-0",workload="load",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/web",dst_service="web.shop",tls="true"} 5000
response_latency_ms_bucket{le="4000.0",direction="outbound",namespace="shop",pod="load-0",workload="load",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/web",dst_service="web.shop",tls="true"} 5000
response_latency_ms_bucket{le="5000.0",direction="outbound",namespace="shop",pod="load-0",workload="load",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/web",dst_service="web.shop",tls="true"} 5000
response_latency_ms_bucket{le="10000.0",direction="outbound",namespace="shop",pod="load-0",workload="load",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/web",dst_service="web.shop",tls="true"} 5000
response_latency_ms_bucket{le="20000.0",direction="outbound",namespace="shop",pod="load-0",workload="load",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/web",dst_service="web.shop",tls="true"} 5000
response_latency_ms_bucket{le="30000.0",direction="outbound",namespace="shop",pod="load-0",workload="load",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/web",dst_service="web.shop",tls="true"} 5000
response_latency_ms_bucket{le="40000.0",direction="outbound",namespace="shop",pod="load-0",workload="load",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/web",dst_service="web.shop",tls="true"} 5000
response_latency_ms_bucket{le="50000.0",direction="outbound",namespace="shop",pod="load-0",workload="load",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/web",dst_service="web.shop",tls="true"} 5000
response_latency_ms_bucket{le="+Inf",direction="outbound",namespace="shop",pod="load-0",workload="load",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/web",dst_service="web.shop",tls="true"} 5000
response_latency_ms_sum{direction="inbound",namespace="shop",pod="api-1",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 1500.0
response_latency_ms_count{direction="inbound",namespace="shop",pod="api-1",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 1000
response_latency_ms_bucket{le="1.0",direction="inbound",namespace="shop",pod="api-1",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 0
response_latency_ms_bucket{le="2.0",direction="inbound",namespace="shop",pod="api-1",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 1000
response_latency_ms_bucket{le="3.0",direction="inbound",namespace="shop",pod="api-1",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 1000
response_latency_ms_bucket{le="4.0",direction="inbound",namespace="shop",pod="api-1",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 1000
response_latency_ms_bucket{le="5.0",direction="inbound",namespace="shop",pod="api-1",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 1000
response_latency_ms_bucket{le="10.0",direction="inbound",namespace="shop",pod="api-1",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 1000
response_latency_ms_bucket{le="20.0",direction="inbound",namespace="shop",pod="api-1",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 1000
response_latency_ms_bucket{le="30.0",direction="inbound",namespace="shop",pod="api-1",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 1000
response_latency_ms_bucket{le="40.0",direction="inbound",namespace="shop",pod="api-1",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 1000
response_latency_ms_bucket{le="50.0",direction="inbound",namespace="shop",pod="api-1",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 1000
response_latency_ms_bucket{le="100.0",direction="inbound",namespace="shop",pod="api-1",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 1000
response_latency_ms_bucket{le="200.0",direction="inbound",namespace="shop",pod="api-1",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 1000
response_latency_ms_bucket{le="300.0",direction="inbound",namespace="shop",pod="api-1",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 1000
response_latency_ms_bucket{le="400.0",direction="inbound",namespace="shop",pod="api-1",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 1000
response_latency_ms_bucket{le="500.0",direction="inbound",namespace="shop",pod="api-1",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 1000
response_latency_ms_bucket{le="1000.0",direction="inbound",namespace="shop",pod="api-1",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 1000
response_latency_ms_bucket{le="2000.0",direction="inbound",namespace="shop",pod="api-1",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 1000
response_latency_ms_bucket{le="3000.0",direction="inbound",namespace="shop",pod="api-1",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 1000
response_latency_ms_bucket{le="4000.0",direction="inbound",namespace="shop",pod="api-1",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 1000
response_latency_ms_bucket{le="5000.0",direction="inbound",namespace="shop",pod="api-1",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 1000
response_latency_ms_bucket{le="10000.0",direction="inbound",namespace="shop",pod="api-1",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 1000
response_latency_ms_bucket{le="20000.0",direction="inbound",namespace="shop",pod="api-1",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 1000
response_latency_ms_bucket{le="30000.0",direction="inbound",namespace="shop",pod="api-1",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 1000
response_latency_ms_bucket{le="40000.0",direction="inbound",namespace="shop",pod="api-1",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 1000
response_latency_ms_bucket{le="50000.0",direction="inbound",namespace="shop",pod="api-1",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 1000
response_latency_ms_bucket{le="+Inf",direction="inbound",namespace="shop",pod="api-1",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 1000
# EOF
"#;
/// Node b, 10 s later.
pub const B2: &str = r#"# HELP identity_cert_expiration_timestamp_seconds notAfter of the current workload certificate, seconds since the Unix epoch.
# TYPE identity_cert_expiration_timestamp_seconds gauge
identity_cert_expiration_timestamp_seconds{identity="spiffe://cluster.local/ns/shop/sa/api"} 1900000000
identity_cert_expiration_timestamp_seconds{identity="spiffe://cluster.local/ns/shop/sa/load"} 1900000000
# HELP request HTTP requests.
# TYPE request counter
request_total{direction="inbound",namespace="shop",pod="api-1",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 1100
request_total{direction="outbound",namespace="shop",pod="load-0",workload="load",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/web",dst_service="web.shop",tls="true"} 5200
# HELP response HTTP responses, by status, classification and gRPC status.
# TYPE response counter
response_total{direction="outbound",namespace="shop",pod="load-0",workload="load",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/web",dst_service="web.shop",tls="true",status_code="200",classification="success",grpc_status=""} 5180
response_total{direction="inbound",namespace="shop",pod="api-1",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true",status_code="200",classification="success",grpc_status=""} 1098
response_total{direction="outbound",namespace="shop",pod="load-0",workload="load",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/web",dst_service="web.shop",tls="true",status_code="500",classification="failure",grpc_status=""} 20
response_total{direction="inbound",namespace="shop",pod="api-1",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true",status_code="503",classification="failure",grpc_status=""} 2
# HELP response_latency_ms Time to response headers, in milliseconds.
# TYPE response_latency_ms histogram
response_latency_ms_sum{direction="outbound",namespace="shop",pod="load-0",workload="load",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/web",dst_service="web.shop",tls="true"} 37400.0
response_latency_ms_count{direction="outbound",namespace="shop",pod="load-0",workload="load",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/web",dst_service="web.shop",tls="true"} 5200
response_latency_ms_bucket{le="1.0",direction="outbound",namespace="shop",pod="load-0",workload="load",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/web",dst_service="web.shop",tls="true"} 0
response_latency_ms_bucket{le="2.0",direction="outbound",namespace="shop",pod="load-0",workload="load",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/web",dst_service="web.shop",tls="true"} 0
response_latency_ms_bucket{le="3.0",direction="outbound",namespace="shop",pod="load-0",workload="load",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/web",dst_service="web.shop",tls="true"} 0
response_latency_ms_bucket{le="4.0",direction="outbound",namespace="shop",pod="load-0",workload="load",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/web",dst_service="web.shop",tls="true"} 0
response_latency_ms_bucket{le="5.0",direction="outbound",namespace="shop",pod="load-0",workload="load",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/web",dst_service="web.shop",tls="true"} 0
response_latency_ms_bucket{le="10.0",direction="outbound",namespace="shop",pod="load-0",workload="load",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/web",dst_service="web.shop",tls="true"} 5100
response_latency_ms_bucket{le="20.0",direction="outbound",namespace="shop",pod="load-0",workload="load",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/web",dst_service="web.shop",tls="true"} 5180
response_latency_ms_bucket{le="30.0",direction="outbound",namespace="shop",pod="load-0",workload="load",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/web",dst_service="web.shop",tls="true"} 5200
response_latency_ms_bucket{le="40.0",direction="outbound",namespace="shop",pod="load-0",workload="load",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/web",dst_service="web.shop",tls="true"} 5200
response_latency_ms_bucket{le="50.0",direction="outbound",namespace="shop",pod="load-0",workload="load",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/web",dst_service="web.shop",tls="true"} 5200
response_latency_ms_bucket{le="100.0",direction="outbound",namespace="shop",pod="load-0",workload="load",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/web",dst_service="web.shop",tls="true"} 5200
response_latency_ms_bucket{le="200.0",direction="outbound",namespace="shop",pod="load-0",workload="load",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/web",dst_service="web.shop",tls="true"} 5200
response_latency_ms_bucket{le="300.0",direction="outbound",namespace="shop",pod="load-0",workload="load",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/web",dst_service="web.shop",tls="true"} 5200
response_latency_ms_bucket{le="400.0",direction="outbound",namespace="shop",pod="load-0",workload="load",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/web",dst_service="web.shop",tls="true"} 5200
response_latency_ms_bucket{le="500.0",direction="outbound",namespace="shop",pod="load-0",workload="load",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/web",dst_service="web.shop",tls="true"} 5200
response_latency_ms_bucket{le="1000.0",direction="outbound",namespace="shop",pod="load-0",workload="load",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/web",dst_service="web.shop",tls="true"} 5200
response_latency_ms_bucket{le="2000.0",direction="outbound",namespace="shop",pod="load-0",workload="load",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/web",dst_service="web.shop",tls="true"} 5200
response_latency_ms_bucket{le="3000.0",direction="outbound",namespace="shop",pod="load-0",workload="load",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/web",dst_service="web.shop",tls="true"} 5200
response_latency_ms_bucket{le="4000.0",direction="outbound",namespace="shop",pod="load-0",workload="load",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/web",dst_service="web.shop",tls="true"} 5200
response_latency_ms_bucket{le="5000.0",direction="outbound",namespace="shop",pod="load-0",workload="load",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/web",dst_service="web.shop",tls="true"} 5200
response_latency_ms_bucket{le="10000.0",direction="outbound",namespace="shop",pod="load-0",workload="load",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/web",dst_service="web.shop",tls="true"} 5200
response_latency_ms_bucket{le="20000.0",direction="outbound",namespace="shop",pod="load-0",workload="load",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/web",dst_service="web.shop",tls="true"} 5200
response_latency_ms_bucket{le="30000.0",direction="outbound",namespace="shop",pod="load-0",workload="load",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/web",dst_service="web.shop",tls="true"} 5200
response_latency_ms_bucket{le="40000.0",direction="outbound",namespace="shop",pod="load-0",workload="load",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/web",dst_service="web.shop",tls="true"} 5200
response_latency_ms_bucket{le="50000.0",direction="outbound",namespace="shop",pod="load-0",workload="load",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/web",dst_service="web.shop",tls="true"} 5200
response_latency_ms_bucket{le="+Inf",direction="outbound",namespace="shop",pod="load-0",workload="load",client_id="",server_id="spiffe://cluster.local/ns/shop/sa/web",dst_service="web.shop",tls="true"} 5200
response_latency_ms_sum{direction="inbound",namespace="shop",pod="api-1",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 1750.0
response_latency_ms_count{direction="inbound",namespace="shop",pod="api-1",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 1100
response_latency_ms_bucket{le="1.0",direction="inbound",namespace="shop",pod="api-1",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 0
response_latency_ms_bucket{le="2.0",direction="inbound",namespace="shop",pod="api-1",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 1000
response_latency_ms_bucket{le="3.0",direction="inbound",namespace="shop",pod="api-1",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 1100
response_latency_ms_bucket{le="4.0",direction="inbound",namespace="shop",pod="api-1",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 1100
response_latency_ms_bucket{le="5.0",direction="inbound",namespace="shop",pod="api-1",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 1100
response_latency_ms_bucket{le="10.0",direction="inbound",namespace="shop",pod="api-1",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 1100
response_latency_ms_bucket{le="20.0",direction="inbound",namespace="shop",pod="api-1",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 1100
response_latency_ms_bucket{le="30.0",direction="inbound",namespace="shop",pod="api-1",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 1100
response_latency_ms_bucket{le="40.0",direction="inbound",namespace="shop",pod="api-1",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 1100
response_latency_ms_bucket{le="50.0",direction="inbound",namespace="shop",pod="api-1",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 1100
response_latency_ms_bucket{le="100.0",direction="inbound",namespace="shop",pod="api-1",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 1100
response_latency_ms_bucket{le="200.0",direction="inbound",namespace="shop",pod="api-1",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 1100
response_latency_ms_bucket{le="300.0",direction="inbound",namespace="shop",pod="api-1",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 1100
response_latency_ms_bucket{le="400.0",direction="inbound",namespace="shop",pod="api-1",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 1100
response_latency_ms_bucket{le="500.0",direction="inbound",namespace="shop",pod="api-1",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 1100
response_latency_ms_bucket{le="1000.0",direction="inbound",namespace="shop",pod="api-1",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 1100
response_latency_ms_bucket{le="2000.0",direction="inbound",namespace="shop",pod="api-1",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 1100
response_latency_ms_bucket{le="3000.0",direction="inbound",namespace="shop",pod="api-1",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 1100
response_latency_ms_bucket{le="4000.0",direction="inbound",namespace="shop",pod="api-1",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 1100
response_latency_ms_bucket{le="5000.0",direction="inbound",namespace="shop",pod="api-1",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 1100
response_latency_ms_bucket{le="10000.0",direction="inbound",namespace="shop",pod="api-1",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 1100
response_latency_ms_bucket{le="20000.0",direction="inbound",namespace="shop",pod="api-1",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 1100
response_latency_ms_bucket{le="30000.0",direction="inbound",namespace="shop",pod="api-1",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 1100
response_latency_ms_bucket{le="40000.0",direction="inbound",namespace="shop",pod="api-1",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 1100
response_latency_ms_bucket{le="50000.0",direction="inbound",namespace="shop",pod="api-1",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 1100
response_latency_ms_bucket{le="+Inf",direction="inbound",namespace="shop",pod="api-1",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 1100
# EOF
"#;

mod replay {
    use prometheus_client::encoding::EncodeLabelSet;
    use prometheus_client::metrics::counter::Counter;
    use prometheus_client::metrics::family::Family;
    use prometheus_client::metrics::gauge::Gauge;
    use prometheus_client::metrics::histogram::Histogram;
    use prometheus_client::registry::Registry;

    /// node-proxy's `TrafficLabels`, field for field.
    #[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
    pub struct TrafficLabels {
        direction: String,
        namespace: String,
        pod: String,
        workload: String,
        client_id: String,
        server_id: String,
        dst_service: String,
        tls: String,
    }

    /// node-proxy's `ResponseLabels`.
    #[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
    struct ResponseLabels {
        #[prometheus(flatten)]
        base: TrafficLabels,
        status_code: String,
        classification: String,
        grpc_status: String,
    }

    #[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
    struct IdentityLabels {
        identity: String,
    }

    #[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
    struct ErrorLabels {
        direction: String,
        error: String,
    }

    /// node-proxy's `BUCKETS_MS`.
    const BUCKETS_MS: [f64; 25] = [
        1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 20.0, 30.0, 40.0, 50.0, 100.0, 200.0, 300.0, 400.0, 500.0,
        1000.0, 2000.0, 3000.0, 4000.0, 5000.0, 10000.0, 20000.0, 30000.0, 40000.0, 50000.0,
    ];

    const TD: &str = "spiffe://cluster.local/ns/shop/sa/";

    pub fn inbound(pod: &str, workload: &str, client: Option<&str>) -> TrafficLabels {
        TrafficLabels {
            direction: "inbound".into(),
            namespace: "shop".into(),
            pod: pod.into(),
            workload: workload.into(),
            client_id: client.map(|c| format!("{TD}{c}")).unwrap_or_default(),
            server_id: String::new(),
            dst_service: String::new(),
            tls: if client.is_some() {
                "true"
            } else {
                "no_identity"
            }
            .into(),
        }
    }

    pub fn outbound(pod: &str, workload: &str, server: Option<&str>, svc: &str) -> TrafficLabels {
        TrafficLabels {
            direction: "outbound".into(),
            namespace: "shop".into(),
            pod: pod.into(),
            workload: workload.into(),
            client_id: String::new(),
            server_id: server.map(|c| format!("{TD}{c}")).unwrap_or_default(),
            dst_service: svc.into(),
            tls: if server.is_some() {
                "true"
            } else {
                "no_identity"
            }
            .into(),
        }
    }

    /// One node proxy's registry, registered as `ambit_proxy::app` does (the families the
    /// tests read, and some they must ignore).
    pub struct Node {
        registry: Registry,
        identity: Family<IdentityLabels, Gauge>,
        errors: Family<ErrorLabels, Counter>,
        open_total: Family<TrafficLabels, Counter>,
        close_total: Family<TrafficLabels, Counter>,
        open_connections: Family<TrafficLabels, Gauge>,
        read_bytes: Family<TrafficLabels, Counter>,
        write_bytes: Family<TrafficLabels, Counter>,
        requests: Family<TrafficLabels, Counter>,
        responses: Family<ResponseLabels, Counter>,
        latency: Family<TrafficLabels, Histogram, fn() -> Histogram>,
    }

    fn histogram() -> Histogram {
        Histogram::new(BUCKETS_MS)
    }

    impl Node {
        pub fn new(identities: &[&str]) -> Self {
            let mut n = Node {
                registry: Registry::default(),
                identity: Family::default(),
                errors: Family::default(),
                open_total: Family::default(),
                close_total: Family::default(),
                open_connections: Family::default(),
                read_bytes: Family::default(),
                write_bytes: Family::default(),
                requests: Family::default(),
                responses: Family::default(),
                latency: Family::new_with_constructor(histogram as fn() -> Histogram),
            };
            let r = &mut n.registry;
            r.register(
                "identity_cert_expiration_timestamp_seconds",
                "notAfter of the current workload certificate, seconds since the Unix epoch",
                n.identity.clone(),
            );
            r.register("tcp_open", "TCP connections opened", n.open_total.clone());
            r.register("tcp_close", "TCP connections closed", n.close_total.clone());
            r.register(
                "tcp_open_connections",
                "TCP connections open now",
                n.open_connections.clone(),
            );
            r.register(
                "tcp_read_bytes",
                "Bytes read from the connection's client side",
                n.read_bytes.clone(),
            );
            r.register(
                "tcp_write_bytes",
                "Bytes written to the connection's client side",
                n.write_bytes.clone(),
            );
            r.register(
                "tcp_errors",
                "Connections that failed, by cause",
                n.errors.clone(),
            );
            r.register("request", "HTTP requests", n.requests.clone());
            r.register(
                "response",
                "HTTP responses, by status, classification and gRPC status",
                n.responses.clone(),
            );
            r.register(
                "response_latency_ms",
                "Time to response headers, in milliseconds",
                n.latency.clone(),
            );
            for id in identities {
                n.identity
                    .get_or_create(&IdentityLabels {
                        identity: format!("{TD}{id}"),
                    })
                    .set(1_900_000_000);
            }
            n
        }

        /// `n` requests answered `status` in `ms` milliseconds.
        pub fn http(&self, l: &TrafficLabels, n: u64, status: u16, ms: f64) {
            self.requests.get_or_create(l).inc_by(n);
            let h = self.latency.get_or_create(l);
            for _ in 0..n {
                h.observe(ms);
            }
            let failed = status >= 500;
            self.responses
                .get_or_create(&ResponseLabels {
                    base: l.clone(),
                    status_code: status.to_string(),
                    classification: if failed { "failure" } else { "success" }.into(),
                    grpc_status: String::new(),
                })
                .inc_by(n);
        }

        /// `opened` connections opened, `closed` of them closed with `read` and `written`
        /// bytes in all.
        pub fn tcp(&self, l: &TrafficLabels, opened: i64, closed: i64, read: u64, written: u64) {
            self.open_total.get_or_create(l).inc_by(opened as u64);
            self.close_total.get_or_create(l).inc_by(closed as u64);
            self.open_connections
                .get_or_create(l)
                .inc_by(opened - closed);
            self.read_bytes.get_or_create(l).inc_by(read);
            self.write_bytes.get_or_create(l).inc_by(written);
        }

        pub fn error(&self, direction: &str, error: &str) {
            self.errors
                .get_or_create(&ErrorLabels {
                    direction: direction.into(),
                    error: error.into(),
                })
                .inc();
        }

        pub fn text(&self) -> String {
            let mut t = String::new();
            prometheus_client::encoding::text::encode(&mut t, &self.registry).unwrap();
            t
        }
    }

    /// The two nodes' scrapes: (a1, a2, b1, b2).
    pub fn record() -> [String; 4] {
        let a = Node::new(&["web", "api"]);
        let b = Node::new(&["api", "load"]);
        let web_in = inbound("web-0", "web", Some("load"));
        let web_api = outbound("web-0", "web", Some("api"), "api.shop");
        let web_db = outbound("web-0", "web", None, "db.data");
        let api0_in = inbound("api-0", "api", Some("web"));
        let api0_plain = inbound("api-0", "api", None);
        let api1_in = inbound("api-1", "api", Some("web"));
        let load_web = outbound("load-0", "load", Some("web"), "web.shop");

        // Before the first scrape.
        a.http(&web_in, 500, 200, 4.5);
        a.http(&web_in, 390, 200, 7.0);
        a.http(&web_in, 10, 500, 7.0);
        a.http(&web_in, 100, 200, 15.0);
        a.http(&web_api, 1000, 200, 0.5);
        a.http(&web_api, 996, 200, 1.5);
        a.http(&web_api, 4, 503, 1.5);
        a.tcp(&web_db, 10, 9, 9000, 900);
        a.http(&api0_in, 1000, 200, 0.5);
        a.http(&api0_in, 1997, 200, 1.5);
        a.http(&api0_in, 3, 503, 1.5);
        a.tcp(&api0_plain, 5, 3, 100, 1000);
        a.error("inbound", "client");
        b.http(&api1_in, 999, 200, 1.5);
        b.http(&api1_in, 1, 503, 1.5);
        b.http(&load_web, 4990, 200, 7.0);
        b.http(&load_web, 10, 500, 7.0);
        let (a1, b1) = (a.text(), b.text());

        // The 10 s window.
        a.http(&web_in, 60, 200, 4.5);
        a.http(&web_in, 70, 200, 7.0);
        a.http(&web_in, 10, 500, 7.0);
        a.http(&web_in, 50, 200, 15.0);
        a.http(&web_in, 10, 200, 25.0);
        a.http(&web_api, 198, 200, 1.5);
        a.http(&web_api, 2, 503, 1.5);
        a.http(&web_api, 198, 200, 2.5);
        a.http(&web_api, 2, 503, 2.5);
        a.tcp(&web_db, 2, 2, 2000, 200);
        a.http(&api0_in, 297, 200, 1.5);
        a.http(&api0_in, 3, 503, 1.5);
        a.tcp(&api0_plain, 2, 1, 200, 4000);
        b.http(&api1_in, 99, 200, 2.5);
        b.http(&api1_in, 1, 503, 2.5);
        b.http(&load_web, 90, 200, 7.0);
        b.http(&load_web, 10, 500, 7.0);
        b.http(&load_web, 80, 200, 15.0);
        b.http(&load_web, 20, 200, 25.0);
        [a1, a.text(), b1, b.text()]
    }
}

/// The fixtures as the tests use them: (before, after) snapshots of both proxies.
pub fn snapshots() -> (super::compute::Snapshot, super::compute::Snapshot) {
    let snap = |a: &str, b: &str| super::compute::Snapshot {
        proxies: [
            ("http://a:4191".to_string(), super::parse::parse(a).unwrap()),
            ("http://b:4191".to_string(), super::parse::parse(b).unwrap()),
        ]
        .into(),
    };
    (snap(A1, B1), snap(A2, B2))
}

#[test]
#[ignore = "prints the recording, to paste above"]
fn print_recording() {
    for (name, text) in ["A1", "A2", "B1", "B2"].iter().zip(replay::record()) {
        println!("===={name}\n{text}");
    }
}

#[test]
fn recording_is_what_the_encoder_writes() {
    // The encoder's series order within a family follows a hash map: compare the lines
    // as sets, and the families' order as written.
    fn sorted(t: &str) -> Vec<&str> {
        let mut l: Vec<&str> = t.lines().collect();
        l.sort_unstable();
        l
    }
    let families = |t: &str| -> Vec<String> {
        t.lines()
            .filter(|l| l.starts_with("# TYPE"))
            .map(str::to_string)
            .collect()
    };
    for (recorded, live) in [A1, A2, B1, B2].iter().zip(replay::record()) {
        assert_eq!(sorted(recorded), sorted(&live), "{live}");
        assert_eq!(families(recorded), families(&live));
        assert!(recorded.ends_with("# EOF\n"));
    }
}
