// Command render renders a Helm chart offline, the way `helm template --include-crds`
// does, without helm: Go's text/template with sprig's function map (less env/expandenv)
// and Helm's own functions (include, tpl, required, fail, toYaml, fromYaml, toJson,
// fromJson, lookup returning an empty map), missingkey=zero with Helm's "<no value>"
// scrubbing, Helm's values coalescing (-f files, --set, --set-string, null deletes a
// default), values.schema.json validation with gojsonschema (the library Helm 3 used), the
// Chart.yaml kubeVersion constraint, Helm's template parse order and its install order for
// the output.
//
// Not supported (the chart does not use them): subcharts and dependencies, hooks beyond
// printing them last, .helmignore, .Files.Glob/AsConfig/AsSecrets, toToml, a live
// `lookup`, --set-file/--set-json, capabilities of a real cluster.
//
//	render [--name NAME] [--namespace NS] [-f values.yaml]... [--set k=v]...
//	       [--set-string k=v]... [--kube-version v1.20.2] [--skip-crds]
//	       [--show-notes] [--print-values] CHART_DIR
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"text/template"
	"unicode"

	"github.com/Masterminds/semver"
	"github.com/Masterminds/sprig"
	"github.com/xeipuuv/gojsonschema"
	"sigs.k8s.io/yaml"
)

// Metadata is Chart.yaml (helm's chart.Metadata): templates see it as .Chart.
type Metadata struct {
	Name         string                   `json:"name,omitempty"`
	Home         string                   `json:"home,omitempty"`
	Sources      []string                 `json:"sources,omitempty"`
	Version      string                   `json:"version,omitempty"`
	Description  string                   `json:"description,omitempty"`
	Keywords     []string                 `json:"keywords,omitempty"`
	Maintainers  []map[string]interface{} `json:"maintainers,omitempty"`
	Icon         string                   `json:"icon,omitempty"`
	APIVersion   string                   `json:"apiVersion,omitempty"`
	Condition    string                   `json:"condition,omitempty"`
	Tags         string                   `json:"tags,omitempty"`
	AppVersion   string                   `json:"appVersion,omitempty"`
	Deprecated   bool                     `json:"deprecated,omitempty"`
	Annotations  map[string]string        `json:"annotations,omitempty"`
	KubeVersion  string                   `json:"kubeVersion,omitempty"`
	Dependencies []map[string]interface{} `json:"dependencies,omitempty"`
	Type         string                   `json:"type,omitempty"`
}

// KubeVersion mirrors helm's chartutil.KubeVersion.
type KubeVersion struct {
	Version string
	Major   string
	Minor   string
}

func (kv *KubeVersion) String() string     { return kv.Version }
func (kv *KubeVersion) GitVersion() string { return kv.Version }

// VersionSet mirrors helm's chartutil.VersionSet.
type VersionSet []string

// Has reports whether apiVersion ("apps/v1" or "apps/v1/Deployment") is known.
func (v VersionSet) Has(apiVersion string) bool {
	for _, x := range v {
		if x == apiVersion {
			return true
		}
	}
	return false
}

// BuildInfo mirrors helm's version.BuildInfo.
type BuildInfo struct {
	Version      string
	GitCommit    string
	GitTreeState string
	GoVersion    string
}

// Capabilities mirrors helm's chartutil.Capabilities: fixed, no cluster is asked.
type Capabilities struct {
	KubeVersion KubeVersion
	APIVersions VersionSet
	HelmVersion BuildInfo
}

// Built-in API group versions of Kubernetes 1.20 (what .Capabilities.APIVersions.Has sees).
var defaultAPIVersions = VersionSet{
	"v1", "admissionregistration.k8s.io/v1", "admissionregistration.k8s.io/v1beta1",
	"apiextensions.k8s.io/v1", "apiextensions.k8s.io/v1beta1", "apiregistration.k8s.io/v1",
	"apiregistration.k8s.io/v1beta1", "apps/v1", "authentication.k8s.io/v1",
	"authentication.k8s.io/v1beta1", "authorization.k8s.io/v1", "authorization.k8s.io/v1beta1",
	"autoscaling/v1", "autoscaling/v2beta1", "autoscaling/v2beta2", "batch/v1", "batch/v1beta1",
	"certificates.k8s.io/v1", "certificates.k8s.io/v1beta1", "coordination.k8s.io/v1",
	"coordination.k8s.io/v1beta1", "discovery.k8s.io/v1beta1", "events.k8s.io/v1",
	"events.k8s.io/v1beta1", "extensions/v1beta1", "flowcontrol.apiserver.k8s.io/v1beta1",
	"networking.k8s.io/v1", "networking.k8s.io/v1beta1", "node.k8s.io/v1", "node.k8s.io/v1beta1",
	"policy/v1beta1", "rbac.authorization.k8s.io/v1", "rbac.authorization.k8s.io/v1beta1",
	"scheduling.k8s.io/v1", "scheduling.k8s.io/v1beta1", "storage.k8s.io/v1",
	"storage.k8s.io/v1beta1",
}

// Files mirrors helm's engine.files: the chart's files outside templates/ (.Files).
type Files map[string][]byte

// GetBytes returns a file's content, or nil.
func (f Files) GetBytes(name string) []byte { return f[name] }

// Get returns a file's content as a string, or "".
func (f Files) Get(name string) string { return string(f[name]) }

// Lines returns a file's lines.
func (f Files) Lines(name string) []string {
	if f[name] == nil {
		return []string{}
	}
	return strings.Split(string(f[name]), "\n")
}

// Chart is a loaded chart directory.
type Chart struct {
	Meta      Metadata
	Values    map[string]interface{}
	Schema    []byte
	Templates map[string]string // "name/templates/x.yaml" -> source
	CRDs      []crdFile
	Files     Files
}

type crdFile struct {
	Name string // "name/crds/x.yaml"
	Data []byte
}

var semverRE = regexp.MustCompile(`^v?(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$`)

func loadChart(dir string) (*Chart, error) {
	raw, err := os.ReadFile(filepath.Join(dir, "Chart.yaml"))
	if err != nil {
		return nil, fmt.Errorf("Chart.yaml file is missing: %w", err)
	}
	c := &Chart{Templates: map[string]string{}, Files: Files{}}
	if err := yaml.Unmarshal(raw, &c.Meta); err != nil {
		return nil, fmt.Errorf("cannot load Chart.yaml: %w", err)
	}
	switch {
	case c.Meta.APIVersion == "":
		return nil, errors.New("validation: chart.metadata.apiVersion is required")
	case c.Meta.APIVersion != "v2":
		return nil, fmt.Errorf("apiVersion %q is not supported by this renderer (only v2)", c.Meta.APIVersion)
	case c.Meta.Name == "":
		return nil, errors.New("validation: chart.metadata.name is required")
	case c.Meta.Version == "" || !semverRE.MatchString(c.Meta.Version):
		return nil, fmt.Errorf("validation: chart.metadata.version %q is invalid", c.Meta.Version)
	case c.Meta.Type != "" && c.Meta.Type != "application":
		return nil, fmt.Errorf("chart type %q cannot be rendered", c.Meta.Type)
	case len(c.Meta.Dependencies) > 0:
		return nil, errors.New("chart dependencies (subcharts) are not supported by this renderer")
	}
	if _, err := os.Stat(filepath.Join(dir, "charts")); err == nil {
		return nil, errors.New("charts/ (subcharts) is not supported by this renderer")
	}
	c.Values = map[string]interface{}{}
	if raw, err := os.ReadFile(filepath.Join(dir, "values.yaml")); err == nil {
		if err := yaml.Unmarshal(raw, &c.Values); err != nil {
			return nil, fmt.Errorf("cannot load values.yaml: %w", err)
		}
		if c.Values == nil {
			c.Values = map[string]interface{}{}
		}
	}
	if raw, err := os.ReadFile(filepath.Join(dir, "values.schema.json")); err == nil {
		c.Schema = raw
	}
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		rel, _ := filepath.Rel(dir, p)
		rel = filepath.ToSlash(rel)
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		switch {
		case rel == "Chart.yaml" || rel == "values.yaml" || rel == "values.schema.json":
		case strings.HasPrefix(rel, "templates/"):
			c.Templates[c.Meta.Name+"/"+rel] = string(data)
		default:
			c.Files[rel] = data
			ext := path.Ext(rel)
			if strings.HasPrefix(rel, "crds/") && (ext == ".yaml" || ext == ".yml" || ext == ".json") {
				c.CRDs = append(c.CRDs, crdFile{Name: c.Meta.Name + "/" + rel, Data: data})
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	sort.Slice(c.CRDs, func(i, j int) bool { return c.CRDs[i].Name < c.CRDs[j].Name })
	return c, nil
}

// ---- values ----------------------------------------------------------------------------

// mergeMaps is helm's cmd/helm values merge of -f files and --set: maps merge, the rest
// is replaced.
func mergeMaps(a, b map[string]interface{}) map[string]interface{} {
	out := make(map[string]interface{}, len(a))
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		if v, ok := v.(map[string]interface{}); ok {
			if bv, ok := out[k]; ok {
				if bv, ok := bv.(map[string]interface{}); ok {
					out[k] = mergeMaps(bv, v)
					continue
				}
			}
		}
		out[k] = v
	}
	return out
}

// coalesce is helm's chartutil.CoalesceValues for a chart without subcharts: user values
// win, maps merge, a user null deletes the chart default.
func coalesce(chartValues, user map[string]interface{}, warn func(string)) map[string]interface{} {
	v := deepCopy(user).(map[string]interface{})
	coalesceTables(v, deepCopy(chartValues).(map[string]interface{}), "", warn)
	return v
}

func coalesceTables(dst, src map[string]interface{}, prefix string, warn func(string)) {
	for key, val := range src {
		full := prefix + key
		if dv, ok := dst[key]; ok && dv == nil {
			delete(dst, key)
		} else if !ok {
			dst[key] = val
		} else if sv, ok := val.(map[string]interface{}); ok {
			if dm, ok := dv.(map[string]interface{}); ok {
				coalesceTables(dm, sv, full+".", warn)
			} else {
				warn(fmt.Sprintf("cannot overwrite table with non table for %s (%v)", full, val))
			}
		} else if _, ok := dv.(map[string]interface{}); ok && val != nil {
			warn(fmt.Sprintf("destination for %s is a table. Ignoring non-table value (%v)", full, val))
		}
	}
}

func deepCopy(v interface{}) interface{} {
	switch t := v.(type) {
	case map[string]interface{}:
		m := make(map[string]interface{}, len(t))
		for k, x := range t {
			m[k] = deepCopy(x)
		}
		return m
	case []interface{}:
		l := make([]interface{}, len(t))
		for i, x := range t {
			l[i] = deepCopy(x)
		}
		return l
	default:
		return v
	}
}

// validateSchema is helm 3's chartutil.ValidateAgainstSingleSchema (gojsonschema).
func validateSchema(c *Chart, values map[string]interface{}) error {
	if c.Schema == nil {
		return nil
	}
	valuesJSON, err := json.Marshal(values)
	if err != nil {
		return err
	}
	if bytes.Equal(valuesJSON, []byte("null")) {
		valuesJSON = []byte("{}")
	}
	result, err := gojsonschema.Validate(gojsonschema.NewBytesLoader(c.Schema), gojsonschema.NewBytesLoader(valuesJSON))
	if err != nil {
		return fmt.Errorf("values.schema.json: %w", err)
	}
	if result.Valid() {
		return nil
	}
	var sb strings.Builder
	for _, desc := range result.Errors() {
		sb.WriteString(fmt.Sprintf("- %s\n", desc))
	}
	return fmt.Errorf("values don't meet the specifications of the schema(s) in the following chart(s):\n%s:\n%s", c.Meta.Name, sb.String())
}

// ---- template functions (helm's pkg/engine/funcs.go) -----------------------------------

func toYAML(v interface{}) string {
	data, err := yaml.Marshal(v)
	if err != nil {
		return "" // helm swallows errors inside a template
	}
	return strings.TrimSuffix(string(data), "\n")
}

func fromYAML(str string) map[string]interface{} {
	m := map[string]interface{}{}
	if err := yaml.Unmarshal([]byte(str), &m); err != nil {
		m["Error"] = err.Error()
	}
	return m
}

func fromYAMLArray(str string) []interface{} {
	a := []interface{}{}
	if err := yaml.Unmarshal([]byte(str), &a); err != nil {
		a = []interface{}{err.Error()}
	}
	return a
}

func toJSON(v interface{}) string {
	data, err := json.Marshal(v)
	if err != nil {
		return ""
	}
	return string(data)
}

func fromJSON(str string) map[string]interface{} {
	m := make(map[string]interface{})
	if err := json.Unmarshal([]byte(str), &m); err != nil {
		m["Error"] = err.Error()
	}
	return m
}

func fromJSONArray(str string) []interface{} {
	a := []interface{}{}
	if err := json.Unmarshal([]byte(str), &a); err != nil {
		a = []interface{}{err.Error()}
	}
	return a
}

func funcMap() template.FuncMap {
	f := sprig.TxtFuncMap()
	delete(f, "env")
	delete(f, "expandenv")
	extra := template.FuncMap{
		"toYaml":        toYAML,
		"fromYaml":      fromYAML,
		"fromYamlArray": fromYAMLArray,
		"toJson":        toJSON,
		"fromJson":      fromJSON,
		"fromJsonArray": fromJSONArray,
		// Late-bound in initFuncs; declared so parsing knows them.
		"include":  func(string, interface{}) string { return "not implemented" },
		"tpl":      func(string, interface{}) interface{} { return "not implemented" },
		"required": func(string, interface{}) (interface{}, error) { return "not implemented", nil },
		// helm template without a cluster: lookup finds nothing.
		"lookup": func(string, string, string, string) (map[string]interface{}, error) {
			return map[string]interface{}{}, nil
		},
	}
	for k, v := range extra {
		f[k] = v
	}
	return f
}

const recursionMaxNums = 1000

func includeFun(t *template.Template, included map[string]int) func(string, interface{}) (string, error) {
	return func(name string, data interface{}) (string, error) {
		var buf strings.Builder
		if v, ok := included[name]; ok {
			if v > recursionMaxNums {
				return "", fmt.Errorf("unable to execute template: rendering template has a nested reference name: %s", name)
			}
			included[name]++
		} else {
			included[name] = 1
		}
		err := t.ExecuteTemplate(&buf, name, data)
		included[name]--
		return buf.String(), err
	}
}

func tplFun(parent *template.Template, included map[string]int) func(string, interface{}) (string, error) {
	return func(tpl string, vals interface{}) (string, error) {
		t, err := parent.Clone()
		if err != nil {
			return "", fmt.Errorf("cannot clone template: %w", err)
		}
		t.Option("missingkey=zero")
		t.Funcs(template.FuncMap{
			"include": includeFun(t, included),
			"tpl":     tplFun(t, included),
		})
		name := "tpl"
		if m, ok := vals.(map[string]interface{}); ok {
			if tm, ok := m["Template"].(map[string]interface{}); ok {
				if bp, ok := tm["BasePath"].(string); ok {
					name = bp
				}
			}
		}
		if _, err := t.New(name).Parse(tpl); err != nil {
			return "", fmt.Errorf("cannot parse template %q: %w", tpl, err)
		}
		var buf strings.Builder
		if err := t.ExecuteTemplate(&buf, name, vals); err != nil {
			return "", fmt.Errorf("error during tpl function execution for %q: %w", tpl, err)
		}
		return strings.ReplaceAll(buf.String(), "<no value>", ""), nil
	}
}

func initFuncs(t *template.Template) {
	f := funcMap()
	included := map[string]int{}
	f["include"] = includeFun(t, included)
	f["tpl"] = tplFun(t, included)
	f["required"] = func(warn string, val interface{}) (interface{}, error) {
		if val == nil {
			return val, errors.New(warn)
		} else if s, ok := val.(string); ok && s == "" {
			return val, errors.New(warn)
		}
		return val, nil
	}
	f["fail"] = func(msg string) (string, error) { return "", errors.New(msg) }
	t.Funcs(f)
}

// sortTemplates is helm's parse order: deeper paths first, then reverse lexical.
func sortTemplates(tpls map[string]string) []string {
	keys := make([]string, 0, len(tpls))
	for k := range tpls {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		a, b := keys[i], keys[j]
		ca, cb := strings.Count(a, "/"), strings.Count(b, "/")
		if ca == cb {
			return a > b
		}
		return ca > cb
	})
	return keys
}

// render executes every template; partials (_*) are parsed but not output.
func render(c *Chart, top map[string]interface{}) (map[string]string, error) {
	t := template.New("gotpl")
	t.Option("missingkey=zero")
	initFuncs(t)
	keys := sortTemplates(c.Templates)
	for _, name := range keys {
		if _, err := t.New(name).Parse(c.Templates[name]); err != nil {
			return nil, fmt.Errorf("parse error in %q: %w", name, err)
		}
	}
	out := map[string]string{}
	for _, name := range keys {
		if strings.HasPrefix(path.Base(name), "_") {
			continue
		}
		vals := make(map[string]interface{}, len(top)+1)
		for k, v := range top {
			vals[k] = v
		}
		vals["Template"] = map[string]interface{}{"Name": name, "BasePath": c.Meta.Name + "/templates"}
		var buf strings.Builder
		if err := t.ExecuteTemplate(&buf, name, vals); err != nil {
			return nil, fmt.Errorf("render error in %q: %w", name, err)
		}
		out[name] = strings.ReplaceAll(buf.String(), "<no value>", "")
	}
	return out, nil
}

// ---- manifest splitting and ordering (helm's releaseutil) -------------------------------

var sep = regexp.MustCompile(`(?:^|\s*\n)---\s*`)

// splitManifests is Helm 4's releaseutil.SplitManifests: documents keep their trailing
// whitespace (Helm 3 trimmed it too; no difference to the objects).
func splitManifests(big string) []string {
	var res []string
	for _, d := range sep.Split(strings.TrimLeftFunc(big, unicode.IsSpace), -1) {
		if d == "" {
			continue
		}
		res = append(res, strings.TrimLeftFunc(d, unicode.IsSpace))
	}
	return res
}

var installOrder = []string{
	"PriorityLevelConfiguration", "FlowSchema", "PriorityClass", "Namespace", "NetworkPolicy",
	"ResourceQuota", "LimitRange", "PodSecurityPolicy", "PodDisruptionBudget", "ServiceAccount",
	"Secret", "SecretList", "ConfigMap", "StorageClass", "PersistentVolume",
	"PersistentVolumeClaim", "CustomResourceDefinition", "ClusterRole", "ClusterRoleList",
	"ClusterRoleBinding", "ClusterRoleBindingList", "Role", "RoleList", "RoleBinding",
	"RoleBindingList", "Service", "DaemonSet", "Pod", "ReplicationController", "ReplicaSet",
	"Deployment", "HorizontalPodAutoscaler", "StatefulSet", "Job", "CronJob", "IngressClass",
	"Ingress", "APIService", "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration",
}

type manifest struct {
	Name    string
	Content string
	Kind    string
}

type simpleHead struct {
	Version  string `json:"apiVersion"`
	Kind     string `json:"kind,omitempty"`
	Metadata *struct {
		Name        string            `json:"name"`
		Annotations map[string]string `json:"annotations"`
	} `json:"metadata,omitempty"`
}

func sortByKind(ms []manifest) {
	order := map[string]int{}
	for i, k := range installOrder {
		order[k] = i
	}
	sort.SliceStable(ms, func(i, j int) bool {
		a, aok := order[ms[i].Kind]
		b, bok := order[ms[j].Kind]
		if !aok && !bok {
			if ms[i].Kind != ms[j].Kind {
				return ms[i].Kind < ms[j].Kind
			}
			return false
		}
		if !aok {
			return false
		}
		if !bok {
			return true
		}
		return a < b
	})
}

// sortManifests splits rendered files into documents, drops NOTES/partials/empties, and
// orders them the way helm installs them; documents with a helm.sh/hook annotation are
// returned apart.
func sortManifests(files map[string]string) (manifests, hooks []manifest, err error) {
	paths := make([]string, 0, len(files))
	for p := range files {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		content := files[p]
		if strings.HasPrefix(path.Base(p), "_") || strings.TrimSpace(content) == "" {
			continue
		}
		for _, m := range splitManifests(content) {
			var head simpleHead
			if err := yaml.Unmarshal([]byte(m), &head); err != nil {
				return nil, nil, fmt.Errorf("YAML parse error on %s: %w", p, err)
			}
			entry := manifest{Name: p, Content: m, Kind: head.Kind}
			if head.Metadata != nil && head.Metadata.Annotations["helm.sh/hook"] != "" {
				hooks = append(hooks, entry)
			} else {
				manifests = append(manifests, entry)
			}
		}
	}
	sortByKind(manifests)
	sortByKind(hooks)
	return manifests, hooks, nil
}

// ---- command line ----------------------------------------------------------------------

type options struct {
	chartDir    string
	name        string
	namespace   string
	valueFiles  []string
	sets        []string
	setStrings  []string
	kubeVersion string
	skipCRDs    bool
	showNotes   bool
	printValues bool
}

const usage = `usage: render [--name NAME] [--namespace NS] [-f VALUES.yaml]... [--set k=v]...
              [--set-string k=v]... [--kube-version v1.20.2] [--skip-crds]
              [--show-notes] [--print-values] CHART_DIR`

func parseArgs(args []string) (*options, error) {
	o := &options{name: "resourcewatch", namespace: "default", kubeVersion: "v1.20.2"}
	for i := 0; i < len(args); i++ {
		a := args[i]
		val := func() (string, error) {
			if k, v, ok := strings.Cut(a, "="); ok && strings.HasPrefix(k, "--") {
				return v, nil
			}
			if i+1 >= len(args) {
				return "", fmt.Errorf("flag %s needs a value", a)
			}
			i++
			return args[i], nil
		}
		flagName, _, _ := strings.Cut(a, "=")
		var err error
		var v string
		switch flagName {
		case "-h", "--help":
			fmt.Println(usage)
			os.Exit(0)
		case "--name":
			v, err = val()
			o.name = v
		case "-n", "--namespace":
			v, err = val()
			o.namespace = v
		case "-f", "--values":
			v, err = val()
			o.valueFiles = append(o.valueFiles, v)
		case "--set":
			v, err = val()
			o.sets = append(o.sets, v)
		case "--set-string":
			v, err = val()
			o.setStrings = append(o.setStrings, v)
		case "--kube-version":
			v, err = val()
			o.kubeVersion = v
		case "--skip-crds":
			o.skipCRDs = true
		case "--show-notes":
			o.showNotes = true
		case "--print-values":
			o.printValues = true
		default:
			if strings.HasPrefix(a, "-") {
				return nil, fmt.Errorf("unknown flag %s\n%s", a, usage)
			}
			if o.chartDir != "" {
				return nil, fmt.Errorf("more than one chart given (%s, %s)\n%s", o.chartDir, a, usage)
			}
			o.chartDir = a
		}
		if err != nil {
			return nil, err
		}
	}
	if o.chartDir == "" {
		return nil, errors.New(usage)
	}
	return o, nil
}

var dns1123Label = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

func parseKubeVersion(s string) (KubeVersion, error) {
	v, err := semver.NewVersion(s)
	if err != nil {
		return KubeVersion{}, fmt.Errorf("invalid --kube-version %q: %w", s, err)
	}
	return KubeVersion{
		Version: "v" + v.String(),
		Major:   fmt.Sprint(v.Major()),
		Minor:   fmt.Sprint(v.Minor()),
	}, nil
}

func run(o *options) (string, error) {
	if len(o.name) > 53 || !dns1123Label.MatchString(o.name) {
		return "", fmt.Errorf("release name %q is invalid: a DNS-1123 label of at most 53 characters", o.name)
	}
	c, err := loadChart(o.chartDir)
	if err != nil {
		return "", err
	}
	user := map[string]interface{}{}
	for _, f := range o.valueFiles {
		raw, err := os.ReadFile(f)
		if err != nil {
			return "", err
		}
		m := map[string]interface{}{}
		if err := yaml.Unmarshal(raw, &m); err != nil {
			return "", fmt.Errorf("failed to parse %s: %w", f, err)
		}
		user = mergeMaps(user, m)
	}
	for _, s := range o.sets {
		if err := parseInto(s, user, false); err != nil {
			return "", fmt.Errorf("failed parsing --set data: %w", err)
		}
	}
	for _, s := range o.setStrings {
		if err := parseInto(s, user, true); err != nil {
			return "", fmt.Errorf("failed parsing --set-string data: %w", err)
		}
	}
	values := coalesce(c.Values, user, func(w string) { fmt.Fprintln(os.Stderr, "warning:", w) })
	if o.printValues {
		return toYAML(values) + "\n", nil
	}
	kv, err := parseKubeVersion(o.kubeVersion)
	if err != nil {
		return "", err
	}
	if c.Meta.KubeVersion != "" {
		constraint, err := semver.NewConstraint(c.Meta.KubeVersion)
		if err != nil {
			return "", fmt.Errorf("Chart.yaml kubeVersion %q: %w", c.Meta.KubeVersion, err)
		}
		ver, _ := semver.NewVersion(kv.Version)
		if !constraint.Check(ver) {
			return "", fmt.Errorf("chart requires kubeVersion: %s which is incompatible with Kubernetes %s", c.Meta.KubeVersion, kv.Version)
		}
	}
	if err := validateSchema(c, values); err != nil {
		return "", err
	}
	meta := c.Meta
	top := map[string]interface{}{
		"Chart": &meta,
		"Capabilities": &Capabilities{
			KubeVersion: kv,
			APIVersions: defaultAPIVersions,
			HelmVersion: BuildInfo{Version: "v3.0.0-resourcewatch-offline-render"},
		},
		"Release": map[string]interface{}{
			"Name":      o.name,
			"Namespace": o.namespace,
			"IsUpgrade": false,
			"IsInstall": true,
			"Revision":  1,
			"Service":   "Helm",
		},
		"Values":    values,
		"Files":     c.Files,
		"Subcharts": map[string]interface{}{},
	}
	files, err := render(c, top)
	if err != nil {
		return "", err
	}
	notes := ""
	for name, content := range files {
		if strings.HasSuffix(name, "NOTES.txt") {
			notes = content
			delete(files, name)
		}
	}
	manifests, hooks, err := sortManifests(files)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	if !o.skipCRDs {
		for _, crd := range c.CRDs {
			fmt.Fprintf(&b, "---\n# Source: %s\n%s\n", crd.Name, crd.Data)
		}
	}
	for _, m := range manifests {
		fmt.Fprintf(&b, "---\n# Source: %s\n%s\n", m.Name, m.Content)
	}
	for _, m := range hooks {
		fmt.Fprintf(os.Stderr, "warning: %s has a helm.sh/hook document: printed last, as helm template does; hooks are not otherwise modelled\n", m.Name)
		fmt.Fprintf(&b, "---\n# Source: %s\n%s\n", m.Name, m.Content)
	}
	if o.showNotes {
		fmt.Fprintf(os.Stderr, "NOTES:\n%s\n", strings.TrimSpace(notes))
	}
	return strings.TrimSpace(b.String()) + "\n", nil
}

func main() {
	o, err := parseArgs(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "Error:", err)
		os.Exit(2)
	}
	out, err := run(o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "Error:", err)
		os.Exit(1)
	}
	fmt.Print(out)
}
