#!/usr/bin/env python3
"""The checks behind charts/check.sh (run that, not this). Each subcommand prints what it
checked and exits 1 on a failure.

  docs RENDER [--namespace NS]     every document is YAML with apiVersion/kind/metadata.name
  remediation OFF_RENDER ON_RENDER the --enable-remediation master switch
  rbac DEFAULT_RENDER GRANTS_RENDER the operator's rights follow what was opted in
  schema CHART_DIR                 values.yaml vs values.schema.json, bad values rejected
  values-file RENDER               the custom values file reached the objects
  crd CHART_DIR REPO_CRD RENDER    files/crds/ is a verbatim copy, rendered by templates/crds.yaml
  monitoring RENDER                metrics.* objects render, with their labels and the dashboard
  monitoring-settings RENDER       monitors' authorization and relabelings, alerts' switches and labels
  accounts NAMED NORBAC            serviceAccount.create/name and rbac.create
  podsecurity RENDER NAMESPACE     operator 'restricted', agent's namespace 'privileged'
  renamed RENDER PREFIX            fullnameOverride=PREFIX renames every object, and every
                                   reference to one (flags, env, RBAC, monitors, rules)
"""
import argparse
import copy
import json
import os
import re
import sys

import yaml

# Cluster-scoped kinds (the ones kustomize's namespace transformer leaves alone).
CLUSTER_SCOPED = {
    "Namespace", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding",
    "PersistentVolume", "StorageClass", "PriorityClass", "APIService", "IngressClass",
    "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration", "RuntimeClass",
    "CSIDriver", "CSINode", "VolumeAttachment", "PodSecurityPolicy", "Node",
    "CertificateSigningRequest", "ComponentStatus", "FlowSchema",
    "PriorityLevelConfiguration",
}

failures = []


def fail(msg):
    failures.append(msg)
    print(f"  FAIL: {msg}")


def ok(msg):
    print(f"  ok: {msg}")


def finish():
    if failures:
        print(f"{len(failures)} check(s) failed")
        sys.exit(1)


def split_docs(text):
    """[(source, text)] for each '---'-separated document of a helm-style stream."""
    out = []
    for chunk in re.split(r"(?m)^---[ \t]*$", text):
        if not chunk.strip():
            continue
        m = re.search(r"(?m)^# Source: (\S+)", chunk)
        out.append((m.group(1) if m else None, chunk))
    return out


def load_objects(path):
    with open(path) as f:
        text = f.read()
    objs = []
    for source, chunk in split_docs(text):
        obj = yaml.safe_load(chunk)
        if obj is None:
            continue
        objs.append((source, obj))
    return objs


def key(obj):
    md = obj.get("metadata") or {}
    return (obj.get("kind"), md.get("namespace") or "", md.get("name"))


def fmt_key(k):
    kind, ns, name = k
    return f"{kind} {ns + '/' if ns else ''}{name}"


# ---- docs -------------------------------------------------------------------------------

def cmd_docs(a):
    with open(a.render) as f:
        text = f.read()
    docs = split_docs(text)
    if not docs:
        fail(f"{a.render}: no documents")
    seen = {}
    for i, (source, chunk) in enumerate(docs):
        where = f"{a.render} document {i + 1} ({source})"
        if source is None:
            fail(f"{where}: no '# Source:' line")
        try:
            obj = yaml.safe_load(chunk)
        except yaml.YAMLError as e:
            fail(f"{where}: not YAML: {e}")
            continue
        if not isinstance(obj, dict):
            fail(f"{where}: not a mapping ({type(obj).__name__})")
            continue
        md = obj.get("metadata")
        for field, val in (("apiVersion", obj.get("apiVersion")), ("kind", obj.get("kind")),
                           ("metadata.name", md.get("name") if isinstance(md, dict) else None)):
            if not isinstance(val, str) or not val:
                fail(f"{where}: missing or empty {field}")
        if not isinstance(md, dict):
            continue
        for field in ("labels", "annotations"):
            for k, v in (md.get(field) or {}).items():
                if not isinstance(v, str):
                    fail(f"{where}: metadata.{field}.{k} is {type(v).__name__}, not a string")
        k = key(obj)
        if k in seen:
            fail(f"{where}: duplicate of {seen[k]}: {fmt_key(k)}")
        seen[k] = where
        if a.namespace is not None:
            ns = md.get("namespace")
            if obj.get("kind") in CLUSTER_SCOPED:
                if ns:
                    fail(f"{where}: cluster-scoped {obj['kind']} has namespace {ns}")
            elif ns != a.namespace:
                fail(f"{where}: {fmt_key(k)} is in namespace {ns!r}, want {a.namespace!r}")
    ok(f"{a.render}: {len(docs)} documents parse as YAML with apiVersion, kind, metadata.name"
       + (f", namespaced ones in {a.namespace}" if a.namespace else ""))
    finish()


# ---- kustomize fallback -----------------------------------------------------------------

# ---- remediation switch -----------------------------------------------------------------

def operator_args(path):
    for _, o in load_objects(path):
        if o.get("kind") == "Deployment" and o["metadata"]["name"] == "resourcewatch-operator":
            for c in o["spec"]["template"]["spec"]["containers"]:
                if c["name"] == "operator":
                    return c.get("args") or [], c.get("env") or []
    raise SystemExit(f"{path}: no resourcewatch-operator Deployment")


def cmd_remediation(a):
    off, off_env = operator_args(a.off)
    on, on_env = operator_args(a.on)
    flag = "--enable-remediation"
    if any(x.startswith(flag) for x in off):
        fail(f"default render passes {flag}: {off}")
    else:
        ok(f"default render: no {flag} (args {off})")
    if any(e.get("name") == "RESOURCEWATCH_ENABLE_REMEDIATION" for e in off_env + on_env):
        fail("RESOURCEWATCH_ENABLE_REMEDIATION set in the env: the switch must be the flag only")
    if on.count(flag) != 1:
        fail(f"remediation.enabled=true render: want {flag} exactly once, args {on}")
    elif [x for x in on if x != flag] != off:
        fail(f"remediation.enabled=true changes other args: {off} -> {on}")
    else:
        ok(f"remediation.enabled=true render: {flag} added, nothing else changed (args {on})")
    finish()


def cmd_rbac(a):
    """The operator's ClusterRole evicts nothing and writes no ConfigMap; those rights come
    only from RoleBindings in the namespaces listed in remediation.namespaces and
    profiles.namespaces (the GRANTS render lists team-a and team-b, and team-a)."""
    def objs(path):
        return [o for _, o in load_objects(path)]
    default, grants = objs(a.default), objs(a.grants)
    role = next((o for o in default if o.get("kind") == "ClusterRole"
                 and o["metadata"]["name"] == "resourcewatch-operator"), None)
    if role is None:
        fail("no ClusterRole resourcewatch-operator")
        return finish()
    bad = [r for r in role.get("rules", [])
           if "pods/eviction" in r.get("resources", [])
           or ("configmaps" in r.get("resources", [])
               and set(r.get("verbs", [])) - {"get", "list", "watch"})]
    if bad:
        fail(f"the operator's ClusterRole may evict or write ConfigMaps everywhere: {bad}")
    else:
        ok("the operator's ClusterRole: no pods/eviction, no ConfigMap writes")
    # Its own namespace's Role: no write to any pod (pods: patch would let the token change
    # the agent DaemonSet's pods' images), and only its own Service's EndpointSlice.
    own = next((o for o in default if o.get("kind") == "Role"
                and o["metadata"]["name"] == "resourcewatch-operator"), None)
    if own is None:
        fail("no Role resourcewatch-operator")
        return finish()
    writes = {"create", "update", "patch", "delete", "deletecollection", "*"}
    pod_writes = [r for r in own.get("rules", [])
                  if {"pods", "*"} & set(r.get("resources", []))
                  and writes & set(r.get("verbs", []))]
    loose_slices = [r for r in own.get("rules", [])
                    if "endpointslices" in r.get("resources", [])
                    and set(r.get("verbs", [])) - {"create"}
                    and r.get("resourceNames") != ["resourcewatch-operator"]]
    if pod_writes or loose_slices:
        fail(f"the operator's Role writes pods or other EndpointSlices: {pod_writes + loose_slices}")
    else:
        ok("the operator's Role: no pod writes; only its Service's EndpointSlice")
    def bindings(docs):
        return sorted((o["metadata"].get("namespace"), o["roleRef"]["name"],
                       o["subjects"][0]["name"])
                      for o in docs if o.get("kind") == "RoleBinding"
                      and o["roleRef"]["name"] in ("resourcewatch-evictor", "resourcewatch-profiler"))
    if bindings(default):
        fail(f"the default render grants: {bindings(default)}")
    want = [("team-a", "resourcewatch-evictor", "resourcewatch-operator"),
            ("team-a", "resourcewatch-profiler", "resourcewatch-operator"),
            ("team-b", "resourcewatch-evictor", "resourcewatch-operator")]
    got = bindings(grants)
    if got != want:
        fail(f"remediation/profiles.namespaces render: want {want}, got {got}")
    else:
        ok(f"grants only where listed: {got}")
    policy_writers = [o["metadata"]["name"] for o in default if o.get("kind") == "ClusterRole"
                      and any("remediationpolicies" in r.get("resources", [])
                              and set(r.get("verbs", [])) & {"create", "update", "patch"}
                              for r in o.get("rules", []))]
    aggregated = {n: next(o for o in default if o.get("kind") == "ClusterRole"
                          and o["metadata"]["name"] == n)["metadata"].get("labels", {})
                  for n in policy_writers}
    if not policy_writers or any(
            l.get("rbac.authorization.k8s.io/aggregate-to-edit") == "true"
            or l.get("rbac.authorization.k8s.io/aggregate-to-admin") != "true"
            for l in aggregated.values()):
        fail(f"RemediationPolicy writers must aggregate to admin only: {aggregated}")
    else:
        ok(f"RemediationPolicy write verbs only in {policy_writers}, aggregated to admin, not edit")
    finish()


# ---- schema -----------------------------------------------------------------------------

def set_path(values, dotted, value):
    values = copy.deepcopy(values)
    cur = values
    parts = dotted.split(".")
    for p in parts[:-1]:
        cur = cur.setdefault(p, {})
    cur[parts[-1]] = value
    return values


# (path, value, why) the schema must reject / accept.
BAD_VALUES = [
    ("operator.replicas", "two", "replicas must be an integer"),
    ("logFormat", "JSON", "the log format is text or json"),
    ("agent.logLevel", "", "an empty log filter"),
    ("operator.replicas", -1, "replicas must be >= 0"),
    ("remediation.enabled", "yes", "the master switch must be a boolean"),
    ("remediation.enable", True, "a misspelt switch must not be silently ignored"),
    ("operator.agentGrace", "20", "agentGrace needs a unit"),
    ("operator.agentGrace", "soon", "agentGrace must be a duration"),
    ("operator.image.pullPolicy", "Sometimes", "pullPolicy is an enum"),
    ("operator.image.tag", 1, "a tag must be a string (use --set-string)"),
    ("operator.image.repository", "", "repository must not be empty"),
    ("agent.image.repository", "localhost/x:1.0", "the tag goes in image.tag"),
    ("agent.tolerations", {"operator": "Exists"}, "tolerations is a list"),
    ("agent.tolerations", [{"operator": "Sometimes"}], "toleration operator is an enum"),
    ("agent.resources.limits.memory", "lots", "resources are Kubernetes quantities"),
    ("agent.podAnnotations", {"a": 1}, "annotations are strings"),
    ("operator.nodeSelector", ["linux"], "nodeSelector is a map"),
    ("imagePullSecrets", ["regcred"], "imagePullSecrets are {name: ...} objects"),
    ("unknownTopLevel", 1, "unknown top-level keys are typos"),
]
GOOD_VALUES = [
    ("operator.replicas", 2), ("operator.replicas", 0),
    ("remediation.enabled", True),
    ("operator.agentGrace", "1m30s"), ("operator.agentGrace", "500ms"),
    ("operator.agentGrace", "1.5h"),
    ("operator.image.tag", ""), ("operator.image.tag", "v0.2.0-rc.1"),
    ("operator.image.repository", "registry.example.com:5000/team/operator"),
    ("agent.tolerations", []),
    ("agent.resources.limits.cpu", 1), ("agent.resources.limits.memory", "1.5Gi"),
    ("agent.nodeSelector", {"kubernetes.io/os": "linux"}),
    ("operator.podAnnotations", {"prometheus.io/scrape": "true"}),
    ("imagePullSecrets", [{"name": "regcred"}]),
    ("global", {"anything": 1}),
]


def cmd_schema(a):
    import jsonschema
    with open(os.path.join(a.chart, "values.schema.json")) as f:
        schema = json.load(f)
    with open(os.path.join(a.chart, "values.yaml")) as f:
        values = yaml.safe_load(f)
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    ok(f"values.schema.json is a valid {cls.__name__} schema")
    v = cls(schema, format_checker=cls.FORMAT_CHECKER)
    errs = list(v.iter_errors(values))
    if errs:
        for e in errs:
            fail(f"values.yaml: {'.'.join(map(str, e.path))}: {e.message}")
    else:
        ok("values.yaml validates against values.schema.json")
    for path, val, why in BAD_VALUES:
        if v.is_valid(set_path(values, path, val)):
            fail(f"schema accepts {path}={val!r} ({why})")
    ok(f"schema rejects {len(BAD_VALUES)} bad values, e.g. operator.replicas=\"two\"")
    for path, val in GOOD_VALUES:
        errs = list(v.iter_errors(set_path(values, path, val)))
        if errs:
            fail(f"schema rejects the valid {path}={val!r}: {errs[0].message}")
    ok(f"schema accepts {len(GOOD_VALUES)} valid variants")
    finish()


# ---- the values-file scenario -----------------------------------------------------------

def cmd_values_file(a):
    objs = {key(o)[0] + "/" + key(o)[2]: o for _, o in load_objects(a.render)}
    dep = objs["Deployment/resourcewatch-operator"]
    ds = objs["DaemonSet/resourcewatch-agent"]
    op = dep["spec"]["template"]["spec"]
    ag = ds["spec"]["template"]["spec"]
    opc, agc = op["containers"][0], ag["containers"][0]
    env = {e["name"]: e.get("value") for e in opc["env"]}
    agent_env = {e["name"]: e.get("value") for e in agc["env"]}
    expect = [
        ("operator image (registry, digest)", opc["image"],
         "registry.example.com:5000/rw/operator@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"),
        ("operator podLabels", dep["spec"]["template"]["metadata"]["labels"].get("example.com/team"), "sre"),
        ("operator extraArgs", opc["args"][-1], "--reconcile-interval=1m"),
        ("operator extraEnv", [e for e in opc["env"] if e["name"] == "RESOURCEWATCH_SECRET_REF"],
         [{"name": "RESOURCEWATCH_SECRET_REF", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]),
        ("agent podLabels (the selector's kept)",
         {k: v for k, v in ds["spec"]["template"]["metadata"]["labels"].items() if k.startswith(("example.com", "app.kubernetes.io/name"))},
         {"example.com/cost-center": "42", "app.kubernetes.io/name": "resourcewatch-agent"}),
        ("agent extraArgs", agc["args"], ["run", "--metrics-addr=off"]),
        ("agent extraEnv", agent_env.get("RESOURCEWATCH_EXTRA"), "1"),
        ("agent affinity", ag.get("affinity", {}).get("nodeAffinity", {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution", {}).get("nodeSelectorTerms"),
         [{"matchExpressions": [{"key": "example.com/pool", "operator": "NotIn", "values": ["gpu"]}]}]),
        ("agent updateStrategy", ds["spec"]["updateStrategy"],
         {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "10%"}}),
        ("operator pullPolicy", opc["imagePullPolicy"], "Always"),
        ("agent image", agc["image"], "registry.example.com:5000/rw/agent:0.1.0"),
        ("agent pullPolicy", agc["imagePullPolicy"], "Never"),
        ("replicas", dep["spec"]["replicas"], 2),
        ("operator RESOURCEWATCH_LOG", env.get("RESOURCEWATCH_LOG"), "debug"),
        ("agent RESOURCEWATCH_LOG", agent_env.get("RESOURCEWATCH_LOG"), "debug,aya=warn"),
        ("log formats", (env.get("RESOURCEWATCH_LOG_FORMAT"),
                         agent_env.get("RESOURCEWATCH_LOG_FORMAT")), ("json", "json")),
        ("--agent-grace", "--agent-grace=45s" in opc["args"], True),
        ("operator resources", opc["resources"], {"requests": {"cpu": "100m", "memory": "64Mi"},
                                                   "limits": {"memory": "512Mi"}}),
        ("agent tolerations", ag.get("tolerations"),
         [{"key": "dedicated", "operator": "Equal", "value": "monitoring", "effect": "NoSchedule"}]),
        ("agent nodeSelector", ag.get("nodeSelector"), {"kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}),
        ("operator nodeSelector", op.get("nodeSelector"), {"node-role.kubernetes.io/control-plane": ""}),
        ("agent podAnnotations", ds["spec"]["template"]["metadata"].get("annotations"),
         {"example.com/team": "sre"}),
        ("imagePullSecrets", (op.get("imagePullSecrets"), ag.get("imagePullSecrets")),
         ([{"name": "regcred"}], [{"name": "regcred"}])),
        ("ClusterRoleBinding subject namespace",
         objs["ClusterRoleBinding/resourcewatch-operator"]["subjects"][0]["namespace"], "monitoring"),
        ("selector unchanged", dep["spec"]["selector"],
         {"matchLabels": {"app.kubernetes.io/name": "resourcewatch-operator"}}),
        ("instance label", dep["metadata"]["labels"].get("app.kubernetes.io/instance"), "rw-test"),
    ]
    for what, got, want in expect:
        if got != want:
            fail(f"values file: {what} is {got!r}, want {want!r}")
    if not failures:
        ok(f"values file: {len(expect)} overrides reached the objects (images by registry, tag and "
           "digest, pull policies, replicas, logLevels, logFormat, agentGrace, resources, tolerations, "
           "nodeSelectors, affinity, annotations, pod labels, extra args and env, the agents' update "
           "strategy, pull secrets, release name and namespace)")
    finish()


# ---- CRD --------------------------------------------------------------------------------

def cmd_crd(a):
    """Every CRD of the chart's files/crds/ is a verbatim copy of the repository's crds/
    file of the same name, and templates/crds.yaml renders each as that file with only
    the annotation helm.sh/resource-policy: keep added."""
    chart_dir = os.path.join(a.chart, "files", "crds")
    if os.path.isdir(os.path.join(a.chart, "crds")):
        fail(f"{a.chart}/crds/ exists: Helm would install it once and never upgrade it "
             "(the CRDs are templates: templates/crds.yaml)")
    names = sorted(n for n in os.listdir(chart_dir) if n.endswith(".yaml"))
    want = sorted(n for n in os.listdir(a.repo_crds) if n.endswith(".yaml"))
    if names != want:
        fail(f"{chart_dir} holds {names}, {a.repo_crds} holds {want}")
    copies = {}
    for n in names:
        with open(os.path.join(chart_dir, n), "rb") as f:
            data = f.read()
        with open(os.path.join(a.repo_crds, n), "rb") as f:
            repo = f.read()
        if data != repo:
            fail(f"{chart_dir}/{n} differs from {a.repo_crds}/{n}: copy it again after `make generate`")
        else:
            ok(f"{chart_dir}/{n} is a verbatim copy of {a.repo_crds}/{n}")
        crd = yaml.safe_load(data)
        copies[crd["metadata"]["name"]] = crd
    rendered = {o["metadata"]["name"]: o for src, o in load_objects(a.render)
                if o.get("kind") == "CustomResourceDefinition"
                and src == "resourcewatch/templates/crds.yaml"}
    if set(rendered) != set(copies):
        fail(f"templates/crds.yaml renders {sorted(rendered)}, want {sorted(copies)}")
    bad = []
    for name, crd in copies.items():
        got = copy.deepcopy(rendered.get(name) or {})
        ann = (got.get("metadata") or {}).get("annotations") or {}
        if ann.get("helm.sh/resource-policy") != "keep":
            bad.append(f"{name}: no helm.sh/resource-policy: keep")
        ann.pop("helm.sh/resource-policy", None)
        if not ann:
            got.get("metadata", {}).pop("annotations", None)
        if got != crd:
            bad.append(f"{name}: differs from its file beyond the annotation")
    if bad:
        fail("; ".join(bad))
    else:
        ok(f"the {len(copies)} CRDs are templates: their files plus helm.sh/resource-policy: keep")
    finish()


# ---- Prometheus objects -------------------------------------------------------------------

def cmd_monitoring(a):
    """What the render cannot say about itself: that each metrics.* switch renders its
    object, with the labels Prometheus and Grafana select on, and the dashboard as valid
    JSON (config/prometheus is this render: charts/config.py)."""
    objs = {o["kind"]: o for _, o in load_objects(a.render)}
    for kind in ("ServiceMonitor", "PodMonitor", "PrometheusRule"):
        if kind not in objs:
            fail(f"metrics.* enabled but no {kind} rendered")
    dash = next((o for _, o in load_objects(a.render) if o.get("kind") == "ConfigMap"
                 and o["metadata"]["name"] == "resourcewatch-grafana-dashboard"), None)
    if not dash:
        fail("metrics.grafanaDashboard enabled but no ConfigMap rendered")
    elif dash["metadata"].get("labels", {}).get("grafana_dashboard") != "1":
        fail("the dashboard's ConfigMap lacks the sidecar's label grafana_dashboard=1")
    else:
        try:
            panels = json.loads(dash.get("data", {}).get("resourcewatch.json", "null"))["panels"]
        except (ValueError, TypeError, KeyError) as e:
            fail(f"the dashboard's ConfigMap holds no dashboard: {e!r}")
        else:
            # Every query follows the cluster variable; every query of series that carry a
            # namespace follows the namespace variable (the agents' own series do not).
            node_level = ("Agent", "Kernel time", "Memory samples lost")
            for panel in panels:
                for t in panel.get("targets", []):
                    expr = t.get("expr", "")
                    if '$cluster' not in expr:
                        fail(f"dashboard panel {panel.get('title')!r} ignores $cluster: {expr}")
                    if not panel.get("title", "").startswith(node_level) and '$namespace' not in expr:
                        fail(f"dashboard panel {panel.get('title')!r} ignores $namespace: {expr}")
            ok(f"the dashboard renders with {len(panels)} panels, each following $cluster and, "
               "where its series have a namespace, $namespace")
    rule = objs.get("PrometheusRule", {})
    if rule.get("metadata", {}).get("labels", {}).get("release") != "kps":
        fail("metrics.prometheusRule.labels are not on the PrometheusRule")
    ok("ServiceMonitor, PodMonitor, PrometheusRule and the dashboard's ConfigMap render")
    finish()


def cmd_monitoring_settings(a):
    """The monitors' and alerts' settings reach the objects: a token from a Secret in place
    of the file (what arbitraryFSAccessThroughSMs.deny requires), relabelings, alerts off by
    name, labels on every alert, the runbooks' address."""
    objs = {o["kind"]: o for _, o in load_objects(a.render)}
    sm = objs.get("ServiceMonitor", {}).get("spec", {}).get("endpoints", [{}])[0]
    pm = objs.get("PodMonitor", {}).get("spec", {}).get("podMetricsEndpoints", [{}])[0]
    rules = [r for g in objs.get("PrometheusRule", {}).get("spec", {}).get("groups", [])
             for r in g.get("rules", []) if "alert" in r]
    names = {r["alert"] for r in rules}
    expect = [
        ("ServiceMonitor authorization", sm.get("authorization"),
         {"type": "Bearer", "credentials": {"name": "prom-token", "key": "token"}}),
        ("no bearerTokenFile with authorization", "bearerTokenFile" in sm, False),
        ("ServiceMonitor relabelings", sm.get("relabelings"),
         [{"targetLabel": "cluster", "replacement": "east"}]),
        ("ServiceMonitor metricRelabelings", sm.get("metricRelabelings"),
         [{"sourceLabels": ["__name__"], "regex": "go_.*", "action": "drop"}]),
        ("PodMonitor relabelings (node kept first)", pm.get("relabelings"),
         [{"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"},
          {"targetLabel": "cluster", "replacement": "east"}]),
        ("disabled alerts left out", names & {"ResourceWatchAgentLosingSamples", "ResourceWatchAPIServerErrors"}, set()),
        ("other alerts kept", "ResourceWatchPredictedOOMSoon" in names and len(names) >= 8, True),
        ("additionalLabels on every alert", all(r.get("labels", {}).get("team") == "sre" for r in rules), True),
        ("alerts' own labels kept", all("severity" in r.get("labels", {}) for r in rules), True),
        ("runbook URLs", sorted({r["annotations"]["runbook_url"].split("#")[0] for r in rules}),
         ["https://runbooks.example.com/resourcewatch"]),
    ]
    for what, got, want in expect:
        if got != want:
            fail(f"monitoring settings: {what} is {got!r}, want {want!r}")
    if not failures:
        ok(f"monitoring settings: {len(expect)} checks (authorization from a Secret, relabelings, "
           "alerts off by name, added labels, runbook address)")
    finish()


def cmd_accounts(a):
    """serviceAccount.create/name and rbac.create: the workloads run as the accounts named,
    the bindings name them, the operator accepts the agents' tokens for the agents' account,
    and nothing of RBAC renders when it is off."""
    def objs(path):
        return {key(o)[0] + "/" + key(o)[2]: o for _, o in load_objects(path)}
    named, norbac = objs(a.named), objs(a.norbac)
    dep = named["Deployment/resourcewatch-operator"]["spec"]["template"]["spec"]
    ds = named["DaemonSet/resourcewatch-agent"]["spec"]["template"]["spec"]
    sas = sorted(k for k in named if k.startswith("ServiceAccount/"))
    subjects = {s["name"] for k, o in named.items() if k.startswith(("ClusterRoleBinding/", "RoleBinding/"))
                for s in o.get("subjects", []) if s.get("kind") == "ServiceAccount"}
    rbac_left = sorted(k for k in norbac if k.split("/")[0] in
                       ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"))
    expect = [
        ("operator's account", dep.get("serviceAccountName"), "ops"),
        ("agents' account", ds.get("serviceAccountName"), "node-agents"),
        ("ServiceAccounts made", sas, ["ServiceAccount/node-agents"]),
        ("binding subjects", subjects, {"ops"}),
        ("--agent-service-account", "--agent-service-account=node-agents" in dep["containers"][0]["args"], True),
        ("RBAC objects with rbac.create=false", rbac_left, []),
        ("workloads still rendered without RBAC", "Deployment/resourcewatch-operator" in norbac, True),
    ]
    for what, got, want in expect:
        if got != want:
            fail(f"accounts: {what} is {got!r}, want {want!r}")
    if not failures:
        ok(f"accounts: {len(expect)} checks (serviceAccount.create/name for both, rbac.create)")
    finish()


# ---- Pod Security -------------------------------------------------------------------------

def restricted_violations(pod_spec):
    """The Pod Security Standards' "restricted" checks that apply to a pod template
    (https://kubernetes.io/docs/concepts/security/pod-security-standards/).

    Hand-made because the only implementation is the API server's admission plugin (Go,
    k8s.io/pod-security-admission), which the 1.20 cluster here predates; a server-side
    dry run on a 1.25+ cluster with the namespace labelled `enforce: restricted` is the
    real check. Kept to the checks that apply to these two pod templates."""
    out = []
    psc = pod_spec.get("securityContext") or {}
    for host in ("hostPID", "hostIPC", "hostNetwork"):
        if pod_spec.get(host):
            out.append(f"{host}: true")
    allowed_volumes = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                       "persistentVolumeClaim", "projected", "secret"}
    for v in pod_spec.get("volumes") or []:
        kinds = set(v) - {"name"}
        if not kinds <= allowed_volumes:
            out.append(f"volume {v['name']}: {sorted(kinds - allowed_volumes)}")
    for c in (pod_spec.get("initContainers") or []) + pod_spec.get("containers", []):
        sc = c.get("securityContext") or {}
        name = c["name"]
        if sc.get("privileged"):
            out.append(f"{name}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{name}: allowPrivilegeEscalation is not false")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            out.append(f"{name}: capabilities do not drop ALL")
        if set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
            out.append(f"{name}: adds {caps['add']}")
        if not sc.get("runAsNonRoot", psc.get("runAsNonRoot")):
            out.append(f"{name}: runAsNonRoot is not true")
        if sc.get("runAsUser", psc.get("runAsUser")) == 0:
            out.append(f"{name}: runAsUser 0")
        seccomp = (sc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f"{name}: seccompProfile {seccomp!r}, not RuntimeDefault or Localhost")
        for p in c.get("ports") or []:
            if p.get("hostPort"):
                out.append(f"{name}: hostPort {p['hostPort']}")
    return out


def cmd_production(a):
    """Two replicas get a PodDisruptionBudget and are spread across nodes; one replica
    gets no budget (it would block every drain of its node); a user's affinity and
    priority classes reach the pods."""
    def objs(path):
        return {key(o)[0] + "/" + key(o)[2]: o for _, o in load_objects(path)}
    one, two = objs(a.one), objs(a.two)
    pdbs = lambda o: [k for k in o if k.startswith("PodDisruptionBudget/")]
    if pdbs(one):
        fail(f"one replica got a PodDisruptionBudget: {pdbs(one)}")
    pdb = two.get("PodDisruptionBudget/resourcewatch-operator")
    dep = two["Deployment/resourcewatch-operator"]
    if not pdb or pdb["spec"].get("maxUnavailable") != 1:
        fail(f"two replicas: no PodDisruptionBudget of maxUnavailable 1: {pdb}")
    elif pdb["spec"]["selector"] != dep["spec"]["selector"]:
        fail("the PodDisruptionBudget does not select the operator's pods")
    spec = dep["spec"]["template"]["spec"]
    term = (spec.get("affinity", {}).get("podAntiAffinity", {})
            .get("preferredDuringSchedulingIgnoredDuringExecution") or [{}])[0].get("podAffinityTerm", {})
    if term.get("topologyKey") != "kubernetes.io/hostname" or \
            term.get("labelSelector") != dep["spec"]["selector"]:
        fail(f"two replicas are not spread across nodes: {spec.get('affinity')}")
    if "affinity" in one["Deployment/resourcewatch-operator"]["spec"]["template"]["spec"]:
        fail("one replica got an affinity nobody asked for")
    if spec.get("priorityClassName") != "system-cluster-critical":
        fail(f"operator.priorityClassName did not reach the pods: {spec.get('priorityClassName')}")
    agent = two["DaemonSet/resourcewatch-agent"]["spec"]["template"]["spec"]
    if agent.get("priorityClassName") != "system-node-critical":
        fail(f"agent.priorityClassName did not reach the pods: {agent.get('priorityClassName')}")
    user = objs(a.user)["Deployment/resourcewatch-operator"]["spec"]["template"]["spec"]
    if "podAntiAffinity" in user.get("affinity", {}) or "nodeAffinity" not in user.get("affinity", {}):
        fail(f"a user's operator.affinity is not used as given: {user.get('affinity')}")
    if not failures:
        ok("2 replicas: PodDisruptionBudget (maxUnavailable 1) and anti-affinity by hostname; "
           "1 replica: neither; a user's affinity replaces the default; priority classes reach the pods")
    finish()


def cmd_renamed(a):
    """Rendered with fullnameOverride=PREFIX (every optional object on): no object keeps a
    resourcewatch name but the CRDs, and every name one object gives another (the
    operator's flags, the agent's variables and volumes, the test pod, RBAC names and
    references, the monitors, the rules) is one the render or the operator creates."""
    p = a.prefix
    objs = {key(o): o for _, o in load_objects(a.render)}
    by_kind = lambda kind: {k[2]: o for k, o in objs.items() if k[0] == kind}
    stale = [fmt_key(k) for k in objs
             if k[0] != "CustomResourceDefinition" and not k[2].startswith(p + "-") and k[2] != p]
    if stale:
        fail(f"objects not renamed to {p}-*: {stale}")
    op_name, agent_name = f"{p}-operator", f"{p}-agent"
    dep = by_kind("Deployment").get(op_name)
    ds = by_kind("DaemonSet").get(agent_name)
    svc = by_kind("Service").get(op_name)
    if not (dep and ds and svc):
        fail(f"no Deployment, DaemonSet and Service named {op_name}/{agent_name}")
        finish()
    # What the operator creates at run time must be the names its Role grants.
    role = by_kind("Role")[op_name]
    granted = {n for r in role["rules"] for n in r.get("resourceNames", [])}
    created = {"--ca-secret": f"{p}-ca", "--agent-secret": f"{p}-agent-tls",
               "--metrics-client-secret": f"{p}-metrics-client", "--lease-name": op_name,
               "--ca-bundle-configmap": f"{p}-ca-bundle"}
    existing = {"--service-name": ("Service", op_name), "--agent-service-account":
                ("ServiceAccount", agent_name), "--evictor-cluster-role": ("ClusterRole", f"{p}-evictor")}
    args = dict(x.split("=", 1) for x in
                dep["spec"]["template"]["spec"]["containers"][0].get("args", []) if "=" in x)
    for flag, name in created.items():
        if args.get(flag) != name:
            fail(f"the operator is not told {flag}={name}: {args.get(flag)}")
        elif flag != "--ca-bundle-configmap" and name not in granted:
            fail(f"{flag}={name}: the operator's Role grants only {sorted(granted)}")
    for flag, (kind, name) in existing.items():
        if args.get(flag) != name or name not in by_kind(kind):
            fail(f"{flag}: {args.get(flag)}, want the render's {kind} {name}")
    env_prefix = op_name.upper().replace("-", "_")
    agent_c = ds["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in agent_c.get("env", [])}
    if env.get("OPERATOR_SERVICE") != op_name:
        fail(f"the agent's OPERATOR_SERVICE is {env.get('OPERATOR_SERVICE')}, want {op_name}")
    if env.get("RESOURCEWATCH_OPERATOR") != \
            f"https://$({env_prefix}_SERVICE_HOST):$({env_prefix}_SERVICE_PORT_GRPC)":
        fail(f"the agent dials {env.get('RESOURCEWATCH_OPERATOR')}: not Service {op_name}'s variables")
    if ds["spec"]["template"]["spec"]["serviceAccountName"] != agent_name:
        fail("the agents run as another ServiceAccount")
    secrets = [v["secret"]["secretName"] for v in ds["spec"]["template"]["spec"]["volumes"] if "secret" in v]
    if secrets != [f"{p}-agent-tls"]:
        fail(f"the agents mount Secrets {secrets}, want [{p}-agent-tls]")
    test = by_kind("Pod").get(f"{op_name}-test-ready")
    targs = test["spec"]["containers"][0]["args"] if test else []
    for want in (f"--host=$({env_prefix}_SERVICE_HOST)", f"--port=$({env_prefix}_SERVICE_PORT_METRICS)",
                 f"--server-name={op_name}"):
        if want not in targs:
            fail(f"helm test's pod lacks {want}: {targs}")
    if test and test["spec"]["volumes"][0]["configMap"]["name"] != f"{p}-ca-bundle":
        fail("helm test's pod mounts another CA bundle")
    # RBAC: every reference is to an object of the render.
    for kind in ("RoleBinding", "ClusterRoleBinding"):
        for k, o in objs.items():
            if k[0] != kind:
                continue
            ref = o["roleRef"]
            if ref["name"] not in by_kind(ref["kind"]):
                fail(f"{fmt_key(k)} binds {ref['kind']} {ref['name']}, not in the render")
            for s in o["subjects"]:
                if s["kind"] == "ServiceAccount" and s["name"] not in by_kind("ServiceAccount"):
                    fail(f"{fmt_key(k)} binds ServiceAccount {s['name']}, not in the render")
    text = open(a.render).read()
    for old in ('job="resourcewatch-operator"', 'daemonset="resourcewatch-agent"',
                "name: resourcewatch-ca-bundle", "name: resourcewatch-metrics-client",
                "serverName: resourcewatch-operator"):
        if old in text:
            fail(f"the render still says {old}")
    rules = by_kind("PrometheusRule").get(p)
    exprs = " ".join(r.get("expr", "") for g in (rules or {}).get("spec", {}).get("groups", [])
                     for r in g["rules"])
    if f'job="{op_name}"' not in exprs or f'daemonset="{agent_name}"' not in exprs:
        fail(f"the PrometheusRule {p} does not name job {op_name} and DaemonSet {agent_name}")
    if not failures:
        ok(f"fullnameOverride={p}: {len(objs)} objects, none keeps a resourcewatch name but the "
           "CRDs; the operator's 8 name flags, the agent's Service variables, Secret and "
           "ServiceAccount, helm test, RBAC references, monitors and rules all follow")
    finish()


def cmd_podsecurity(a):
    by_name = {(o["kind"], o["metadata"]["name"]): o for _, o in load_objects(a.render)}
    op = by_name.get(("Deployment", "resourcewatch-operator"))
    agent = by_name.get(("DaemonSet", "resourcewatch-agent"))
    if not op or not agent:
        fail("operator Deployment or agent DaemonSet missing")
    else:
        bad = restricted_violations(op["spec"]["template"]["spec"])
        if bad:
            fail(f"the operator's pod is not Pod Security 'restricted': {bad}")
        else:
            ok("the operator's pod meets Pod Security 'restricted'")
        # The agent cannot meet 'baseline' (hostPID, added capabilities): its namespace
        # must enforce 'privileged', which config/'s Namespace says.
        if not restricted_violations(agent["spec"]["template"]["spec"]):
            fail("the agent unexpectedly meets 'restricted': drop the privileged label")
    ns = [o for _, o in load_objects(a.namespace) if o["kind"] == "Namespace"]
    labels = ns[0]["metadata"].get("labels", {}) if ns else {}
    if labels.get("pod-security.kubernetes.io/enforce") != "privileged":
        fail(f"config/'s Namespace does not enforce 'privileged' for the agent: {labels}")
    else:
        ok("config/'s Namespace enforces 'privileged' (the agent needs hostPID, BPF, PERFMON)")
    finish()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("docs"); s.add_argument("render"); s.add_argument("--namespace")
    s.set_defaults(f=cmd_docs)
    s = sub.add_parser("remediation"); s.add_argument("off"); s.add_argument("on")
    s.set_defaults(f=cmd_remediation)
    s = sub.add_parser("rbac"); s.add_argument("default"); s.add_argument("grants")
    s.set_defaults(f=cmd_rbac)
    s = sub.add_parser("schema"); s.add_argument("chart"); s.set_defaults(f=cmd_schema)
    s = sub.add_parser("values-file"); s.add_argument("render"); s.set_defaults(f=cmd_values_file)
    s = sub.add_parser("crd"); s.add_argument("chart"); s.add_argument("repo_crds")
    s.add_argument("render"); s.set_defaults(f=cmd_crd)
    s = sub.add_parser("monitoring"); s.add_argument("render")
    s.set_defaults(f=cmd_monitoring)
    s = sub.add_parser("accounts"); s.add_argument("named"); s.add_argument("norbac")
    s.set_defaults(f=cmd_accounts)
    s = sub.add_parser("monitoring-settings"); s.add_argument("render")
    s.set_defaults(f=cmd_monitoring_settings)
    s = sub.add_parser("production"); s.add_argument("one"); s.add_argument("two"); s.add_argument("user")
    s.set_defaults(f=cmd_production)
    s = sub.add_parser("renamed"); s.add_argument("render"); s.add_argument("prefix")
    s.set_defaults(f=cmd_renamed)
    s = sub.add_parser("podsecurity"); s.add_argument("render"); s.add_argument("namespace")
    s.set_defaults(f=cmd_podsecurity)
    a = p.parse_args()
    a.f(a)


if __name__ == "__main__":
    main()
