#!/usr/bin/env python3
"""config/ rendered from the chart: one source for the manifests.

  charts/config.py            write config/'s generated files (`make generate` runs this)
  charts/config.py --check    render to a temporary directory and fail, with a diff, when
                              config/ differs (CI: charts/check.sh)

Helm's own engine (charts/helm.sh template) renders charts/resourcewatch with its default
values into the namespace resourcewatch-system, twice: as installed, and with the
Prometheus Operator objects (metrics.*) on for config/prometheus. Each object goes to the
file FILES names for it; the render's text is kept as it is (the templates' comments with
it), less Helm's `# Source:` lines and the four labels only a Helm release carries. An
object the render has and FILES does not place, or the reverse, is an error: a new
template needs a home in config/.

Written by hand, not by a library: it is a text split of Helm's own output by the kind
and name of each document (stdlib only, so `make generate` needs nothing but Helm's
engine); nothing is parsed or re-serialised, so the comments survive.

Not generated: config/crd/ (verbatim copies of crds/, made by `make generate`),
namespace.yaml, the kustomization.yaml files, samples/ and prometheus/RUNBOOKS.md.
"""
import argparse
import difflib
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
NAMESPACE = "resourcewatch-system"
METRICS = ["metrics.serviceMonitor.enabled=true", "metrics.podMonitor.enabled=true",
           "metrics.prometheusRule.enabled=true"]

# config/ file -> the objects it holds, in order: (render, kind, name). "base" is the
# default render, "metrics" the one with metrics.* on.
FILES = {
    "rbac/operator.yaml": [
        ("base", "ServiceAccount", "resourcewatch-operator"),
        ("base", "ClusterRole", "resourcewatch-operator"),
        ("base", "ClusterRoleBinding", "resourcewatch-operator"),
        ("base", "Role", "resourcewatch-operator"),
        ("base", "RoleBinding", "resourcewatch-operator"),
        ("base", "ClusterRole", "resourcewatch-metrics-reader"),
        ("base", "ClusterRole", "resourcewatch-evictor"),
        ("base", "ClusterRole", "resourcewatch-profiler"),
    ],
    "rbac/agent.yaml": [
        ("base", "ServiceAccount", "resourcewatch-agent"),
    ],
    "rbac/users.yaml": [
        ("base", "ClusterRole", "resourcewatch-node-viewer"),
        ("base", "ClusterRole", "resourcewatch-edit"),
        ("base", "ClusterRole", "resourcewatch-policy-admin"),
        ("base", "ClusterRole", "resourcewatch-view"),
    ],
    "operator/operator.yaml": [
        ("base", "Deployment", "resourcewatch-operator"),
        ("base", "Service", "resourcewatch-operator"),
    ],
    "agent/agent.yaml": [
        ("base", "DaemonSet", "resourcewatch-agent"),
    ],
    "prometheus/monitors.yaml": [
        ("metrics", "ServiceMonitor", "resourcewatch-operator"),
        ("metrics", "PodMonitor", "resourcewatch-agent"),
    ],
    "prometheus/prometheusrule.yaml": [
        ("metrics", "PrometheusRule", "resourcewatch"),
    ],
}
# Files copied as they are from the chart's files/.
COPIES = {"prometheus/grafana-dashboard.json": "resourcewatch/files/grafana-dashboard.json"}
# In the render and deliberately in no config/ file.
SKIPPED_KINDS = {"CustomResourceDefinition"}  # config/crd/: copies of crds/

HEADER = (
    "# Generated from charts/resourcewatch by `make generate` (charts/config.py): edit the\n"
    "# chart's templates and run it; CI fails when this file and the chart differ.\n"
)
# Labels a Helm release adds (chart version, release name, manager); config/ is not one.
HELM_LABEL = re.compile(
    r"^\s+(helm\.sh/chart|app\.kubernetes\.io/(managed-by|instance|version)):.*\n", re.M)


class Error(Exception):
    pass


def render(extra):
    cmd = [os.path.join(HERE, "helm.sh"), "template", "--namespace", NAMESPACE, "--skip-tests"]
    for s in extra:
        cmd += ["--set", s]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise Error(f"{' '.join(cmd)} failed:\n{p.stderr}")
    return p.stdout


def documents(text):
    """{(kind, name): text} of a render, each document without its `# Source:` line and
    Helm's labels."""
    out = {}
    for chunk in re.split(r"(?m)^---[ \t]*\n", text):
        chunk = re.sub(r"(?m)^# Source: .*\n", "", chunk)
        if not chunk.strip():
            continue
        kind = re.search(r"(?m)^kind: *(\S+)", chunk)
        name = re.search(r"(?m)^metadata:\n(?:  .*\n)*?  name: *\"?([^\s\"]+)", chunk)
        if not kind or not name:
            raise Error(f"a rendered document without kind or metadata.name:\n{chunk[:400]}")
        chunk = HELM_LABEL.sub("", chunk)
        # An object whose labels were only Helm's has none.
        chunk = re.sub(r"(?m)^  labels:\n(?!    )", "", chunk)
        key = (kind.group(1), name.group(1))
        if key in out:
            raise Error(f"{key[0]}/{key[1]} rendered twice")
        out[key] = chunk.rstrip("\n") + "\n"
    return out


def generate(out_dir):
    renders = {"base": documents(render([])), "metrics": documents(render(METRICS))}
    placed = {"base": set(), "metrics": set()}
    for path, objects in FILES.items():
        docs = []
        for which, kind, name in objects:
            doc = renders[which].get((kind, name))
            if doc is None:
                raise Error(f"{path}: the {which} render has no {kind}/{name}")
            placed[which].add((kind, name))
            docs.append(doc)
        target = os.path.join(out_dir, path)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "w") as f:
            f.write(HEADER + "---\n".join(docs))
    for which, docs in renders.items():
        for kind, name in docs:
            if kind in SKIPPED_KINDS or (kind, name) in placed[which]:
                continue
            if which == "metrics" and (kind, name) in renders["base"]:
                continue
            raise Error(f"the {which} render has {kind}/{name}, which no config/ file holds "
                        "(add it to FILES in charts/config.py)")
    for path, source in COPIES.items():
        shutil.copyfile(os.path.join(HERE, source), os.path.join(out_dir, path))


def generated_paths():
    return list(FILES) + list(COPIES)


def unlisted(config):
    """Generated files no kustomization.yaml installs: config/kustomization.yaml lists
    every file (its `resources:` take no directories on old kustomize), and
    prometheus/kustomization.yaml its own."""
    missing = []
    for path in FILES:
        d, name = ("prometheus", path.split("/", 1)[1]) if path.startswith("prometheus/") \
            else ("", path)
        with open(os.path.join(config, d, "kustomization.yaml")) as f:
            listed = re.findall(r"(?m)^  - (\S+)$", f.read())
        if name not in listed:
            missing.append(f"config/{path} (not in config/{d + '/' if d else ''}kustomization.yaml)")
    return missing


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true",
                    help="fail with a diff when config/ differs from the chart's render")
    a = ap.parse_args()
    config = os.path.join(REPO, "config")
    try:
        if not a.check:
            generate(config)
            print(f"config.py: wrote {len(generated_paths())} files of config/ from the chart")
            return 0
        with tempfile.TemporaryDirectory() as tmp:
            generate(tmp)
            differ = []
            for path in generated_paths():
                with open(os.path.join(tmp, path)) as f:
                    want = f.readlines()
                try:
                    with open(os.path.join(config, path)) as f:
                        have = f.readlines()
                except FileNotFoundError:
                    have = []
                if want != have:
                    differ.append(path)
                    sys.stdout.writelines(difflib.unified_diff(
                        have, want, f"config/{path}", f"rendered {path}", n=2))
            missing = unlisted(config)
            for m in missing:
                print(f"config.py: {m}: add it to the kustomization's resources")
            if differ:
                print(f"config.py: config/ differs from the chart in {', '.join(differ)}: "
                      "run `make generate` (edit the chart's templates, not config/)")
            if differ or missing:
                return 1
            print(f"config.py: the {len(generated_paths())} generated files of config/ "
                  "are the chart's render")
            return 0
    except Error as e:
        print(f"config.py: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
