package main

// A port of the parts of helm's pkg/strvals that --set and --set-string use:
//
//	a=b,c.d=e        nested keys, several assignments separated by commas
//	a[0]=x,a[1].b=y  list indices
//	a={x,y}          a list
//	a\.b=c, a=b\,c   backslash escapes . , = [ ] { }
//
// Typing follows helm's typedVal: true/false/null (any case), integers not starting with
// 0 (and "0") become int64, everything else stays a string; --set-string keeps strings.

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

const maxIndex = 65536

type parser struct {
	s  []rune
	i  int
	st bool
}

func parseInto(s string, dest map[string]interface{}, stringsOnly bool) error {
	p := &parser{s: []rune(s), st: stringsOnly}
	for {
		if p.i >= len(p.s) {
			return nil
		}
		if err := p.key(dest); err != nil {
			return err
		}
		if p.i < len(p.s) && p.s[p.i] == ',' {
			p.i++
			continue
		}
		if p.i >= len(p.s) {
			return nil
		}
	}
}

// runesUntil reads up to (not including) one of stops, honouring backslash escapes.
func (p *parser) runesUntil(stops string) (string, rune) {
	var b strings.Builder
	for p.i < len(p.s) {
		r := p.s[p.i]
		if r == '\\' && p.i+1 < len(p.s) {
			b.WriteRune(p.s[p.i+1])
			p.i += 2
			continue
		}
		if strings.ContainsRune(stops, r) {
			p.i++
			return b.String(), r
		}
		b.WriteRune(r)
		p.i++
	}
	return b.String(), 0
}

func (p *parser) typed(v string) interface{} {
	if p.st {
		return v
	}
	switch {
	case strings.EqualFold(v, "true"):
		return true
	case strings.EqualFold(v, "false"):
		return false
	case strings.EqualFold(v, "null"):
		return nil
	case v == "0":
		return int64(0)
	}
	if len(v) != 0 && v[0] != '0' {
		if iv, err := strconv.ParseInt(v, 10, 64); err == nil {
			return iv
		}
	}
	return v
}

// value reads what follows '=': a {list} or a scalar up to ','.
func (p *parser) value() (interface{}, error) {
	if p.i < len(p.s) && p.s[p.i] == '{' {
		p.i++
		list := []interface{}{}
		for {
			v, last := p.runesUntil(",}")
			if last == 0 {
				return nil, errors.New("list must terminate with '}'")
			}
			if !(last == '}' && v == "" && len(list) == 0) {
				list = append(list, p.typed(v))
			}
			if last == '}' {
				if p.i < len(p.s) && p.s[p.i] != ',' {
					return nil, fmt.Errorf("unexpected %q after list", p.s[p.i])
				}
				return list, nil
			}
		}
	}
	v, _ := p.runesUntil(",")
	if p.i > 0 && p.i <= len(p.s) && p.s[p.i-1] == ',' {
		p.i-- // leave the comma for parseInto
	}
	return p.typed(v), nil
}

func (p *parser) key(data map[string]interface{}) error {
	k, last := p.runesUntil("=.[,")
	switch last {
	case 0:
		if k == "" {
			return nil
		}
		return fmt.Errorf("key %q has no value", k)
	case ',':
		if k == "" {
			return nil
		}
		return fmt.Errorf("key %q has no value (cannot end with ,)", k)
	case '=':
		v, err := p.value()
		if err != nil {
			return fmt.Errorf("key %q: %w", k, err)
		}
		data[k] = v
		return nil
	case '.':
		inner, ok := data[k].(map[string]interface{})
		if !ok {
			inner = map[string]interface{}{}
		}
		if err := p.key(inner); err != nil {
			return err
		}
		data[k] = inner
		return nil
	case '[':
		list, _ := data[k].([]interface{})
		l, err := p.index(list)
		if err != nil {
			return fmt.Errorf("error parsing index for %q: %w", k, err)
		}
		data[k] = l
		return nil
	}
	return nil
}

// index parses "N]" and what follows it (=v, .key, [M]...), returning the updated list.
func (p *parser) index(list []interface{}) ([]interface{}, error) {
	n, last := p.runesUntil("]")
	if last != ']' {
		return nil, errors.New("missing ]")
	}
	idx, err := strconv.Atoi(n)
	if err != nil || idx < 0 || idx > maxIndex {
		return nil, fmt.Errorf("invalid index %q", n)
	}
	for len(list) <= idx {
		list = append(list, nil)
	}
	if p.i >= len(p.s) {
		return nil, errors.New("index without a value")
	}
	c := p.s[p.i]
	p.i++
	switch c {
	case '=':
		v, err := p.value()
		if err != nil {
			return nil, err
		}
		list[idx] = v
	case '.':
		inner, ok := list[idx].(map[string]interface{})
		if !ok {
			inner = map[string]interface{}{}
		}
		if err := p.key(inner); err != nil {
			return nil, err
		}
		list[idx] = inner
	case '[':
		sub, _ := list[idx].([]interface{})
		sub, err := p.index(sub)
		if err != nil {
			return nil, err
		}
		list[idx] = sub
	default:
		return nil, fmt.Errorf("unexpected %q after index", c)
	}
	return list, nil
}
