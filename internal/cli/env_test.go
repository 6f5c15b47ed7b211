package cli

import (
	"strings"
	"testing"
)

func TestFlagsFromEnvironment(t *testing.T) {
	env := Env{Stdout: &strings.Builder{}, Stderr: &strings.Builder{}, Getenv: func(k string) string {
		return map[string]string{"RATELIMIT_NAMESPACE": "fromenv", "RATELIMIT_REDIS": "redis://a:1,redis://b:2", "RATELIMIT_V": "true"}[k]
	}}
	fs := newFlagSet(env, "t", "", "")
	ns := fs.String("namespace", "", "")
	v := fs.Bool("v", false, "")
	var rf redisFlags
	rf.register(fs)
	if _, err := parse(fs, nil); err != nil || *ns != "fromenv" || !*v || strings.Join(rf.urls, " ") != "redis://a:1 redis://b:2" {
		t.Errorf("from the environment: ns %q v %v redis %v err %v", *ns, *v, rf.urls, err)
	}
	fs = newFlagSet(env, "t", "", "")
	ns = fs.String("namespace", "", "")
	if _, err := parse(fs, []string{"--namespace", "fromflag"}); err != nil || *ns != "fromflag" {
		t.Errorf("the flag does not win over the environment: %q %v", *ns, err)
	}
	if got := envName("redis-password-file"); got != "RATELIMIT_REDIS_PASSWORD_FILE" {
		t.Errorf("envName = %q", got)
	}
}
