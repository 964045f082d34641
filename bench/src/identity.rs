//! Certificate issuance throughput: signing alone, and end to end over gRPC.
//!
//! Run on one core, in release mode:
//!
//! ```sh
//! cargo build --release -p ambit-bench
//! taskset -c 0 target/release/identity-bench --count 2000
//! ```
//!
//! CSRs are generated before the clock starts: the figures are the CA's cost (CSR
//! signature check, leaf construction, ECDSA P-256 signing) and, end to end, that plus
//! node authentication, authorization against the index, gRPC and HTTP/2 on loopback.

use ambit_api::proto::identity::identity_client::IdentityClient;
use ambit_api::proto::identity::CertifyRequest;
use ambit_api::WorkloadIdentity;
use ambit_control::pki::generate::{issuer, trust_anchor, Validity};
use ambit_control::pki::{CaConfig, CaFiles, CertificateAuthority};
use ambit_e2e::{node_token, ControlPlane};
use anyhow::Context;
use clap::Parser;
use rcgen::{CertificateParams, KeyPair};
use std::time::{Duration, Instant};

#[derive(Debug, Parser)]
struct Args {
    /// Certificates to issue in each measurement.
    #[arg(long, default_value_t = 2000)]
    count: usize,
    /// Requests in flight at once over the gRPC channel.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
}

const CLUSTER: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: web-0, namespace: shop}\nspec: {nodeName: node-a, serviceAccountName: web, containers: []}\n";

fn csrs(n: usize) -> anyhow::Result<Vec<Vec<u8>>> {
    (0..n)
        .map(|_| {
            let key = KeyPair::generate()?;
            Ok(CertificateParams::default()
                .serialize_request(&key)?
                .der()
                .to_vec())
        })
        .collect()
}

fn signing_alone(csrs: &[Vec<u8>]) -> anyhow::Result<f64> {
    let root = trust_anchor(
        "cluster.local",
        Validity::starting_now(Duration::from_secs(86400 * 3650)),
    )?;
    let iss = issuer(
        &root,
        "cluster.local",
        Validity::starting_now(Duration::from_secs(86400 * 365)),
    )?;
    let files = CaFiles {
        trust_anchors: "bench".into(),
        issuer_cert: "bench".into(),
        issuer_key: "bench".into(),
    };
    let config = CaConfig {
        trust_domain: "cluster.local".into(),
        leaf_lifetime: Duration::from_secs(86400),
        clock_skew_allowance: Duration::from_secs(20),
    };
    let ca = CertificateAuthority::from_pem(
        &files,
        root.cert_pem.as_bytes(),
        iss.cert_pem.as_bytes(),
        iss.key_pem.as_bytes(),
        config,
    )?;
    let id = WorkloadIdentity::new("cluster.local", "shop", "web")?;
    let start = Instant::now();
    for csr in csrs {
        ca.certify(&id, csr)?;
    }
    Ok(csrs.len() as f64 / start.elapsed().as_secs_f64())
}

async fn over_grpc(csrs: Vec<Vec<u8>>, concurrency: usize) -> anyhow::Result<f64> {
    let cp = ControlPlane::start(CLUSTER, &["node-a"]).await;
    let client = IdentityClient::new(cp.channel(&cp.identity_url()));
    let header: tonic::metadata::MetadataValue<_> =
        format!("Bearer {}", node_token("node-a")).parse()?;
    let n = csrs.len();
    let chunks: Vec<Vec<Vec<u8>>> = csrs
        .chunks(n.div_ceil(concurrency))
        .map(<[_]>::to_vec)
        .collect();
    let start = Instant::now();
    let mut tasks = Vec::new();
    for chunk in chunks {
        let mut client = client.clone();
        let header = header.clone();
        tasks.push(tokio::spawn(async move {
            for csr_der in chunk {
                let mut req = tonic::Request::new(CertifyRequest {
                    namespace: "shop".into(),
                    service_account: "web".into(),
                    csr_der,
                });
                req.metadata_mut().insert("authorization", header.clone());
                client.certify(req).await?;
            }
            Ok::<_, tonic::Status>(())
        }));
    }
    for t in tasks {
        t.await?.context("certify")?;
    }
    let rate = n as f64 / start.elapsed().as_secs_f64();
    cp.stop().await;
    Ok(rate)
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let csrs = csrs(args.count)?;
    let sign = signing_alone(&csrs)?;
    // One thread runs client and server: the whole end-to-end path on one core.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let grpc = rt.block_on(over_grpc(csrs, args.concurrency))?;
    println!("| signing alone (CSR check + sign) | {sign:.0} certs/s |");
    println!(
        "| end to end over gRPC, {} in flight | {grpc:.0} certs/s |",
        args.concurrency
    );
    Ok(())
}
