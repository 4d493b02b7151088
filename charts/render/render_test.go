package main

import (
	"reflect"
	"strings"
	"testing"
)

func TestParseInto(t *testing.T) {
	cases := []struct {
		in   string
		want map[string]interface{}
	}{
		{"a=b", map[string]interface{}{"a": "b"}},
		{"a.b=1,c=true,d=FALSE,e=null", map[string]interface{}{
			"a": map[string]interface{}{"b": int64(1)}, "c": true, "d": false, "e": nil}},
		{"v=0,w=012,x=1.5,y=", map[string]interface{}{"v": int64(0), "w": "012", "x": "1.5", "y": ""}},
		{"l={a,2,true}", map[string]interface{}{"l": []interface{}{"a", int64(2), true}}},
		{`k\.x=a\,b`, map[string]interface{}{"k.x": "a,b"}},
		{"t[1].k=v", map[string]interface{}{"t": []interface{}{nil, map[string]interface{}{"k": "v"}}}},
		{"a.b=1,a.c=2", map[string]interface{}{"a": map[string]interface{}{"b": int64(1), "c": int64(2)}}},
	}
	for _, c := range cases {
		got := map[string]interface{}{}
		if err := parseInto(c.in, got, false); err != nil {
			t.Errorf("%q: %v", c.in, err)
			continue
		}
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("%q: got %#v, want %#v", c.in, got, c.want)
		}
	}
	got := map[string]interface{}{}
	if err := parseInto("a=1,b=true", got, true); err != nil || got["a"] != "1" || got["b"] != "true" {
		t.Errorf("--set-string: %#v %v", got, err)
	}
	for _, bad := range []string{"a", "a.b", "a[x]=1", "a={b"} {
		if err := parseInto(bad, map[string]interface{}{}, false); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestCoalesce(t *testing.T) {
	chart := map[string]interface{}{
		"a": map[string]interface{}{"x": 1.0, "y": 2.0},
		"l": []interface{}{"chart"},
		"n": "keep",
	}
	user := map[string]interface{}{
		"a": map[string]interface{}{"y": int64(3), "z": "new"},
		"l": []interface{}{"user"},
		"n": nil,
	}
	got := coalesce(chart, user, func(string) {})
	want := map[string]interface{}{
		"a": map[string]interface{}{"x": 1.0, "y": int64(3), "z": "new"},
		"l": []interface{}{"user"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %#v, want %#v", got, want)
	}
	if _, ok := chart["a"].(map[string]interface{})["z"]; ok {
		t.Error("coalesce modified the chart's values")
	}
}

func renderOne(t *testing.T, templates map[string]string, values map[string]interface{}) (map[string]string, error) {
	t.Helper()
	c := &Chart{Meta: Metadata{Name: "c", Version: "0.1.0"}, Templates: map[string]string{}}
	for k, v := range templates {
		c.Templates["c/templates/"+k] = v
	}
	top := map[string]interface{}{
		"Values":  values,
		"Release": map[string]interface{}{"Name": "r", "Namespace": "ns"},
		"Chart":   &c.Meta,
	}
	return render(c, top)
}

func TestEngine(t *testing.T) {
	out, err := renderOne(t, map[string]string{
		"_h.tpl": `{{- define "h.name" -}}{{ .Release.Name }}-x{{- end }}`,
		"a.yaml": `name: {{ include "h.name" . }}
missing: "{{ .Values.nope }}"
deep: "{{ .Values.m.nope }}"
tpl: {{ tpl .Values.t . }}
y: {{- toYaml .Values.m | nindent 2 }}
j: {{ toJson .Values.m }}
f: {{ (fromYaml "k: v").k }}
l: {{ len (lookup "v1" "Pod" "ns" "p") }}
tn: {{ .Template.Name }}`,
	}, map[string]interface{}{"t": "{{ .Release.Namespace }}", "m": map[string]interface{}{"b": []interface{}{1.0}, "a": "s"}})
	if err != nil {
		t.Fatal(err)
	}
	want := `name: r-x
missing: ""
deep: ""
tpl: ns
y:
  a: s
  b:
  - 1
j: {"a":"s","b":[1]}
f: v
l: 0
tn: c/templates/a.yaml`
	if got := out["c/templates/a.yaml"]; got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	if _, ok := out["c/templates/_h.tpl"]; ok {
		t.Error("partial rendered as output")
	}
	_, err = renderOne(t, map[string]string{"a.yaml": `{{ required "need x" .Values.x }}`}, map[string]interface{}{})
	if err == nil || !strings.Contains(err.Error(), "need x") {
		t.Errorf("required: %v", err)
	}
	_, err = renderOne(t, map[string]string{"a.yaml": `{{ env "HOME" }}`}, map[string]interface{}{})
	if err == nil {
		t.Error("env is available; helm removes it")
	}
}

func TestSortManifests(t *testing.T) {
	ms, hooks, err := sortManifests(map[string]string{
		"c/templates/b.yaml":  "kind: Deployment\nmetadata: {name: d}\n---\nkind: Service\nmetadata: {name: s}\n",
		"c/templates/a.yaml":  "\n---\nkind: ServiceAccount\nmetadata: {name: sa}\n",
		"c/templates/h.yaml":  "kind: Job\nmetadata: {name: j, annotations: {helm.sh/hook: post-install}}\n",
		"c/templates/e.yaml":  "  \n",
		"c/templates/_p.tpl":  "kind: Secret\n",
		"c/templates/z.yaml":  "kind: Widget\nmetadata: {name: w}\n",
		"c/templates/y.yaml":  "kind: Gadget\nmetadata: {name: g}\n",
		"c/templates/cm.yaml": "kind: ConfigMap\nmetadata: {name: c1}\n---\nkind: ConfigMap\nmetadata: {name: c2}\n",
	})
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, m := range ms {
		kinds = append(kinds, m.Kind)
	}
	want := "ServiceAccount ConfigMap ConfigMap Service Deployment Gadget Widget"
	if strings.Join(kinds, " ") != want {
		t.Errorf("order %v, want %s", kinds, want)
	}
	if len(hooks) != 1 || hooks[0].Kind != "Job" {
		t.Errorf("hooks %v", hooks)
	}
	if ms[1].Content != "kind: ConfigMap\nmetadata: {name: c1}" || ms[2].Content != "kind: ConfigMap\nmetadata: {name: c2}\n" {
		t.Errorf("split contents %q %q", ms[1].Content, ms[2].Content)
	}
}
