// Package bearer reads the token of an Authorization: Bearer header, for the
// demo's API and the operations pages.
package bearer

import "strings"

// Token reads an Authorization header's credentials as RFC 9110 and RFC 6750
// write them: the scheme "Bearer", in any case, one or more spaces or tabs,
// then the token (token68: no white space inside, visible ASCII only); spaces
// and tabs around it are allowed, no other white space. It returns false for
// anything else.
func Token(h string) (string, bool) {
	h = strings.Trim(h, " \t")
	i := strings.IndexAny(h, " \t")
	if i < 0 || !strings.EqualFold(h[:i], "Bearer") {
		return "", false
	}
	token := strings.Trim(h[i:], " \t")
	if token == "" || strings.ContainsFunc(token, func(r rune) bool { return r <= ' ' || r >= 0x7f }) {
		return "", false
	}
	return token, true
}
