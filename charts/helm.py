"""Helm for this repository, from Helm's own engine: helm-python-sdk wraps Helm v4's Go SDK
behind a C ABI, so rendering, linting, schema validation, --set parsing and
install/upgrade/uninstall are Helm's code, not ours. Used because no helm binary can be
obtained on the machines this is developed on (only package registries are reachable);
with a helm binary, `helm template|lint|install ...` with the same arguments does the same.
Run through charts/helm.sh, which provides the pinned SDK.

  helm.sh template [--name N] [--namespace NS] [-f FILE]... [--set K=V]... [--set-string K=V]...
                   [--skip-crds] [--skip-tests] [--show-notes] [--print-values] [CHART]
  helm.sh lint [--strict] [--kube-version V] [-f FILE]... [--set K=V]... [CHART]
  helm.sh install|upgrade NAME [CHART] [--namespace NS] [--create-namespace] [-f FILE]...
                   [--set K=V]... [--wait] [--timeout SECONDS]
  helm.sh rollback NAME [REVISION] [--namespace NS] [--wait] [--timeout SECONDS]
  helm.sh history NAME [--namespace NS]
  helm.sh test NAME [--namespace NS] [--timeout SECONDS]
  helm.sh uninstall NAME [--namespace NS] [--wait]

CHART defaults to charts/resourcewatch. install/upgrade/uninstall use the cluster of
KUBECONFIG (Helm's release records are Secrets in the namespace, as with the binary).
`template` writes what `helm template --include-crds` writes (NOTES to stderr with
--show-notes, as `helm install --dry-run` shows them).
"""

import argparse
import os
import sys

import helm_python as helm
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_CHART = os.path.join(HERE, "resourcewatch")
# Client-only operations get a kubeconfig that names no cluster.
NO_CLUSTER = "apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n"


def merge(a, b):
    """Deep merge as Helm merges -f files: maps merge, anything else (lists too) replaces;
    a null is kept, so that Helm's own coalescing with the chart's values deletes the key.

    Hand-made because the SDK's render and install calls take one values map, not Helm's
    list of -f files and --set flags: this is only the order and the overlay of those,
    before Helm's engine coalesces the result with values.yaml and checks the schema."""
    out = dict(a)
    for k, v in b.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge(out[k], v)
        else:
            out[k] = v
    return out


def user_values(a):
    """-f files in order, then every --set, then every --set-string (Helm's order)."""
    values = {}
    for path in a.values or []:
        with open(path) as f:
            values = merge(values, helm.values_from_yaml(f.read()) or {})
    for s in a.set or []:
        values = merge(values, helm.parse_set_string(s))
    for s in getattr(a, "set_string", None) or []:
        values = merge(values, helm.parse_set_string_values(s))
    return values


def values_args(p):
    p.add_argument("-f", "--values", action="append", metavar="FILE")
    p.add_argument("--set", action="append", metavar="K=V")
    p.add_argument("--set-string", action="append", metavar="K=V")


def cmd_template(a):
    chart = a.chart or DEFAULT_CHART
    values = user_values(a)
    with helm.Chart.load(chart) as ch:
        if a.print_values:
            sys.stdout.write(yaml.safe_dump(ch.merge_values(values), sort_keys=True))
            return
        with helm.Config(namespace=a.namespace, storage_driver="memory",
                         kubeconfig_content=NO_CLUSTER) as cfg:
            rel = cfg.install(ch, a.name, values, namespace=a.namespace, dry_run="client")
        crds = "" if a.skip_crds else "".join(
            f"---\n# Source: {c['filename']}\n{c['data']}\n" for c in ch.crds)
        # As `helm template` does, the test hooks too (unless --skip-tests): the release's
        # manifest holds no hooks, so they come from an offline render of templates/tests/.
        tests = "" if a.skip_tests else "".join(
            f"---\n# Source: {path}\n{text.strip()}\n"
            for path, text in sorted(ch.render(values, name=a.name, namespace=a.namespace).items())
            if "/templates/tests/" in path and text.strip())
        sys.stdout.write((crds + rel["manifest"].strip() + "\n" + tests).strip() + "\n")
        if a.show_notes and rel.get("notes"):
            sys.stderr.write("NOTES:\n" + rel["notes"].strip() + "\n")


def cmd_lint(a):
    chart = a.chart or DEFAULT_CHART
    result = helm.lint(chart, user_values(a), strict=a.strict, kube_version=a.kube_version)
    severities = {0: "UNKNOWN", 1: "INFO", 2: "WARNING", 3: "ERROR"}
    bad = 0
    for m in result["messages"]:
        print(f"[{severities.get(m['severity'], m['severity'])}] {m['path']}: {m['error']}")
        bad += m["severity"] >= (2 if a.strict else 3)
    for e in result["errors"]:
        print(f"[ERROR] {e}")
        bad += 1
    print(f"1 chart(s) linted, {'1 chart(s) failed' if bad else '0 chart(s) failed'}")
    sys.exit(1 if bad else 0)


def cluster(a):
    kubeconfig = os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
    return helm.Config(kubeconfig_path=kubeconfig, namespace=a.namespace)


def cmd_install(a):
    chart = a.chart or DEFAULT_CHART
    wait = "watcher" if a.wait else None
    with cluster(a) as cfg:
        if a.cmd == "install":
            rel = cfg.install(chart, a.release, user_values(a), namespace=a.namespace,
                              create_namespace=a.create_namespace, wait=wait,
                              timeout=a.timeout)
        else:
            rel = cfg.upgrade(chart, a.release, user_values(a), namespace=a.namespace,
                              wait=wait, timeout=a.timeout)
    print(f"NAME: {rel.get('name')}\nNAMESPACE: {rel.get('namespace')}\n"
          f"STATUS: {rel.get('status')}\nREVISION: {rel.get('revision')}")
    if rel.get("notes"):
        print("\nNOTES:\n" + rel["notes"].strip())


def cmd_rollback(a):
    with cluster(a) as cfg:
        cfg.rollback(a.release, version=a.revision, timeout=a.timeout,
                     wait="watcher" if a.wait else None)
    print(f"Rollback was a success! ({a.release} to revision {a.revision or 'previous'})")


def cmd_history(a):
    with cluster(a) as cfg:
        rel = cfg.status(a.release)
    # The current revision and its state: what `helm history` ends with.
    print(f"REVISION: {rel.get('revision')}\nSTATUS: {rel.get('status')}")


def cmd_test(a):
    with cluster(a) as cfg:
        res = cfg.test(a.release, timeout=a.timeout, logs=True)
    rel = res.get("release") or {}
    print(f"NAME: {rel.get('name')}\nSTATUS: {rel.get('status')}\nTEST SUITE: passed")
    if res.get("logs"):
        print(res["logs"].strip())


def cmd_uninstall(a):
    with cluster(a) as cfg:
        cfg.uninstall(a.release, wait="watcher" if a.wait else None)
    print(f'release "{a.release}" uninstalled')


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)

    t = sub.add_parser("template", help="render the chart (helm template --include-crds)")
    t.add_argument("chart", nargs="?")
    t.add_argument("--name", default="resourcewatch")
    t.add_argument("-n", "--namespace", default="default")
    values_args(t)
    # The CRDs are templates (templates/crds.yaml): --set crds.install=false leaves them
    # out; this flag skips only a chart's crds/ directory, which this chart has none of.
    t.add_argument("--skip-crds", action="store_true")
    t.add_argument("--skip-tests", action="store_true", help="leave out the test hooks")
    t.add_argument("--show-notes", action="store_true")
    t.add_argument("--print-values", action="store_true",
                   help="print the coalesced values instead of the manifests")
    t.set_defaults(f=cmd_template)

    lint = sub.add_parser("lint", help="helm lint")
    lint.add_argument("chart", nargs="?")
    lint.add_argument("--strict", action="store_true")
    lint.add_argument("--kube-version")
    values_args(lint)
    lint.set_defaults(f=cmd_lint)

    for name in ("install", "upgrade"):
        i = sub.add_parser(name, help=f"helm {name} (the cluster of KUBECONFIG)")
        i.add_argument("release")
        i.add_argument("chart", nargs="?")
        i.add_argument("-n", "--namespace", default="default")
        i.add_argument("--create-namespace", action="store_true")
        i.add_argument("--wait", action="store_true")
        i.add_argument("--timeout", type=int, default=300, help="seconds")
        values_args(i)
        i.set_defaults(f=cmd_install)

    r = sub.add_parser("rollback", help="helm rollback (the cluster of KUBECONFIG)")
    r.add_argument("release")
    r.add_argument("revision", nargs="?", type=int)
    r.add_argument("-n", "--namespace", default="default")
    r.add_argument("--wait", action="store_true")
    r.add_argument("--timeout", type=int, default=300, help="seconds")
    r.set_defaults(f=cmd_rollback)

    h = sub.add_parser("history", help="the release's current revision and status")
    h.add_argument("release")
    h.add_argument("-n", "--namespace", default="default")
    h.set_defaults(f=cmd_history)

    ts = sub.add_parser("test", help="helm test: run the release's test hooks")
    ts.add_argument("release")
    ts.add_argument("-n", "--namespace", default="default")
    ts.add_argument("--timeout", type=int, default=120, help="seconds")
    ts.set_defaults(f=cmd_test)

    u = sub.add_parser("uninstall", help="helm uninstall (the cluster of KUBECONFIG)")
    u.add_argument("release")
    u.add_argument("-n", "--namespace", default="default")
    u.add_argument("--wait", action="store_true")
    u.set_defaults(f=cmd_uninstall)

    a = p.parse_args()
    try:
        a.f(a)
    except helm.HelmError as e:
        sys.stderr.write(f"Error: {e}\n")
        sys.exit(1)


if __name__ == "__main__":
    main()
