use super::*;
use prometheus_client::registry::Registry;
use std::fs;

const NS: &str = "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: shop\n  annotations:\n    ambit.dev/mesh: enabled\n";
const POD: &str = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web-0\n  namespace: shop\nspec:\n  nodeName: node-a\n  serviceAccountName: web\n  containers: [{name: app, image: nginx}]\nstatus:\n  podIP: 10.1.0.5\n";

fn dir_with(files: &[(&str, &str)]) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    for (name, text) in files {
        let p = d.path().join(name);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, text).unwrap();
    }
    d
}

fn load_err(files: &[(&str, &str)]) -> LocalError {
    let d = dir_with(files);
    load_index(d.path(), "cluster.local").unwrap_err()
}

#[test]
fn loads_multi_document_files_lists_and_subdirectories() {
    let list = "apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: ServiceAccount\n  metadata: {name: web, namespace: shop}\n";
    let d = dir_with(&[
        ("cluster.yaml", &format!("{NS}---\n{POD}---\n")),
        ("more/sa.yml", list),
        (
            "deploy.yaml",
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\nspec: {}\n",
        ),
        (".hidden.yaml", "this is not yaml: ["),
        ("README.md", "not read"),
    ]);
    let (objects, skipped) = load_objects(d.path()).unwrap();
    assert_eq!(objects.len(), 3);
    assert_eq!(skipped, 1, "the Deployment is skipped, not an error");
    let idx = load_index(d.path(), "cluster.local").unwrap();
    assert!(idx.has_service_account("shop", "web"));
    assert_eq!(idx.meshed_workloads_on_node("node-a").len(), 1);
}

#[test]
fn misspelt_field_names_the_file_document_object_and_field() {
    let typo = POD.replace("nodeName", "nodeNmae");
    let err = load_err(&[
        ("a.yaml", NS),
        (
            "pods.yaml",
            &format!("{NS}---\n{typo}").replace(
                "name: shop\n  annotations:\n    ambit.dev/mesh: enabled\n",
                "name: other\n",
            ),
        ),
    ]);
    assert!(err.file.ends_with("pods.yaml"), "{err}");
    assert_eq!(err.document, Some(2));
    assert_eq!(err.object.as_deref(), Some("Pod web-0"));
    assert_eq!(err.field.as_deref(), Some("spec.nodeNmae"));
    assert!(err.to_string().contains("unknown field"), "{err}");
}

#[test]
fn wrong_type_names_the_field() {
    let bad = POD.replace(
        "containers: [{name: app, image: nginx}]",
        "containers: [{name: app, image: nginx, ports: [{containerPort: eighty}]}]",
    );
    let err = load_err(&[("pods.yaml", &bad)]);
    assert_eq!(
        err.field.as_deref(),
        Some("spec.containers[0].ports[0].containerPort"),
        "{err}"
    );
    assert_eq!(err.document, Some(1));
}

#[test]
fn yaml_syntax_error_names_the_file_and_document() {
    let err = load_err(&[
        ("ok.yaml", NS),
        ("broken.yaml", &format!("{POD}---\nkind: [unclosed\n")),
    ]);
    assert!(err.file.ends_with("broken.yaml"));
    assert_eq!(err.document, Some(2));
    assert!(err.message.contains("not valid YAML"), "{err}");
}

#[test]
fn missing_kind_wrong_api_version_and_duplicates_are_errors() {
    let err = load_err(&[("a.yaml", "apiVersion: v1\nmetadata: {name: x}\n")]);
    assert_eq!(err.field.as_deref(), Some("kind"));

    let err = load_err(&[("a.yaml", "apiVersion: v2\nkind: Pod\nmetadata: {name: x}\n")]);
    assert_eq!(err.field.as_deref(), Some("apiVersion"));
    assert!(err.message.contains("use \"v1\""), "{err}");

    let err = load_err(&[("a.yaml", NS), ("b.yaml", NS)]);
    assert!(err.message.contains("defined twice"), "{err}");
    assert!(err.message.contains("a.yaml"), "{err}");
}

#[test]
fn semantic_errors_carry_the_file_too() {
    let err = load_err(&[("pods.yaml", &POD.replace("10.1.0.5", "10.1.0.500"))]);
    assert!(err.file.ends_with("pods.yaml"));
    assert_eq!(err.field.as_deref(), Some("status.podIP"));
    assert_eq!(err.object.as_deref(), Some("Pod shop/web-0"));
}

async fn wait_for(rx: &mut tokio::sync::watch::Receiver<u64>) {
    tokio::time::timeout(Duration::from_secs(10), rx.changed())
        .await
        .expect("the index was not reloaded")
        .unwrap();
}

#[tokio::test]
async fn reloads_on_change_and_keeps_the_last_good_state_on_error() {
    let d = dir_with(&[("ns.yaml", NS)]);
    let loaded = fingerprint(d.path());
    let index = SharedIndex::new(load_index(d.path(), "cluster.local").unwrap());
    let mut registry = Registry::default();
    let metrics = LocalMetrics::register(&mut registry);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(watch(
        loaded,
        d.path().to_path_buf(),
        "cluster.local".into(),
        index.clone(),
        Duration::from_millis(20),
        metrics,
        async move {
            let _ = stop_rx.await;
        },
    ));
    let mut rx = index.subscribe();

    fs::write(d.path().join("pod.yaml"), POD).unwrap();
    wait_for(&mut rx).await;
    assert!(index
        .read()
        .node_runs_service_account("node-a", "shop", "web"));

    // A broken edit: the pod stays, the failure is counted.
    fs::write(
        d.path().join("pod.yaml"),
        POD.replace("serviceAccountName", "serviceAcountName"),
    )
    .unwrap();
    let mut text = String::new();
    for _ in 0..500 {
        text.clear();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        if text.contains("local_reloads_total{result=\"failure\"} 1") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        text.contains("local_reloads_total{result=\"failure\"} 1"),
        "{text}"
    );
    assert!(index
        .read()
        .node_runs_service_account("node-a", "shop", "web"));

    // Fixing it (moving the pod to another node) is picked up.
    fs::write(d.path().join("pod.yaml"), POD.replace("node-a", "node-b")).unwrap();
    wait_for(&mut rx).await;
    assert!(index
        .read()
        .node_runs_service_account("node-b", "shop", "web"));
    assert!(!index
        .read()
        .node_runs_service_account("node-a", "shop", "web"));

    // Removing the file removes the pod.
    fs::remove_file(d.path().join("pod.yaml")).unwrap();
    wait_for(&mut rx).await;
    assert!(!index
        .read()
        .node_runs_service_account("node-b", "shop", "web"));
    stop_tx.send(()).unwrap();
    task.await.unwrap();
}

#[test]
fn node_tokens_file_is_checked() {
    let t = NodeTokens::parse(
        "nodes:\n  node-a: aaaaaaaaaaaaaaaaaaaa\n  node-b: bbbbbbbbbbbbbbbbbbbb\n",
    )
    .unwrap();
    assert_eq!(t.node_for("aaaaaaaaaaaaaaaaaaaa"), Some("node-a"));
    assert_eq!(t.node_for("bbbbbbbbbbbbbbbbbbbb"), Some("node-b"));
    assert_eq!(t.node_for("cccccccccccccccccccc"), None);
    let err = NodeTokens::parse("nodes:\n  node-a: short\n").unwrap_err();
    assert!(
        err.contains("nodes.node-a") && err.contains("shorter"),
        "{err}"
    );
    let err = NodeTokens::parse("node:\n  node-a: aaaaaaaaaaaaaaaaaaaa\n").unwrap_err();
    assert!(err.contains("unknown field"), "{err}");
    let err = NodeTokens::parse("nodes:\n  a: aaaaaaaaaaaaaaaaaaaa\n  b: aaaaaaaaaaaaaaaaaaaa\n")
        .unwrap_err();
    assert!(err.contains("same token"), "{err}");
}

#[test]
fn symlink_cycles_are_walked_once_and_configmap_layouts_still_load() {
    use std::os::unix::fs::symlink;
    let sa = |name: &str| {
        format!(
            "apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: {name}, namespace: shop}}\n"
        )
    };
    let d = dir_with(&[
        // A ConfigMap volume: the data in a timestamped directory, `..data` pointing at it,
        // and each file a symlink through `..data`.
        (
            "..2026_01_01_00_00_00.000000001/cluster.yaml",
            &format!("{NS}---\n{POD}"),
        ),
        ("more/sa.yml", &sa("web")),
    ]);
    let root = d.path();
    symlink("..2026_01_01_00_00_00.000000001", root.join("..data")).unwrap();
    symlink("..data/cluster.yaml", root.join("cluster.yaml")).unwrap();
    // Cycles: to the root from below, to itself, and a second path to a directory.
    symlink("..", root.join("more/up")).unwrap();
    symlink(".", root.join("more/self")).unwrap();
    symlink("more", root.join("again")).unwrap();
    // A directory elsewhere, linked in, with a link back to the root (a cycle across
    // trees), and a ConfigMap mounted elsewhere, linked in by its mount and by `..data`.
    let elsewhere = dir_with(&[
        ("other/extra.yaml", &sa("db")),
        ("cm/..2026_01_01_00_00_00.000000002/api.yaml", &sa("api")),
    ]);
    let e = elsewhere.path();
    symlink(root, e.join("other/back")).unwrap();
    symlink(e.join("other"), root.join("linked")).unwrap();
    symlink("..2026_01_01_00_00_00.000000002", e.join("cm/..data")).unwrap();
    symlink("..data/api.yaml", e.join("cm/api.yaml")).unwrap();
    symlink(e.join("cm"), root.join("cm-mount")).unwrap();
    symlink(e.join("cm/..data"), root.join("cm-data")).unwrap();

    let found: Vec<_> = files(root)
        .unwrap()
        .into_iter()
        .map(|f| f.strip_prefix(root).unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        found,
        [
            "cluster.yaml",
            "cm-data/api.yaml",
            "linked/extra.yaml",
            "more/sa.yml"
        ],
        "each file once, by its first path (real directories first, then names in order)"
    );
    let (objects, _) = load_objects(root).unwrap();
    assert_eq!(objects.len(), 5, "Namespace, Pod and three ServiceAccounts");
    let idx = load_index(root, "cluster.local").unwrap();
    assert!(idx.has_service_account("shop", "db"));
    assert!(idx.has_service_account("shop", "api"));
    assert_eq!(idx.meshed_workloads_on_node("node-a").len(), 1);
    assert_eq!(
        fingerprint(root),
        fingerprint(root),
        "the same paths on every poll"
    );
}
