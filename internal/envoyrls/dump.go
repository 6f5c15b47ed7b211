package envoyrls

import (
	"fmt"
	"slices"
	"strings"
)

// Dump describes every rule of c as the peer's /rlconfig prints its
// configuration: one line a rule, "<statistics key>: unit=MINUTE
// requests_per_unit=10, shadow_mode: false, quota_mode: false", with
// ", burst=N" after requests_per_unit where a burst is set (the peer has
// none). Lines are sorted by the key (the peer's order is its maps'). An
// unlimited rule reads unit=UNKNOWN requests_per_unit=0, as the peer's.
func (c *Config) Dump() string {
	var lines []string
	c.eachRule(func(r *Rule) {
		unit := "UNKNOWN"
		if r.Unit != "" {
			unit = strings.ToUpper(r.Unit)
		}
		burst := ""
		if !r.Unlimited && r.Capacity != int64(r.RequestsPerUnit) {
			burst = fmt.Sprintf(", burst=%d", r.Capacity)
		}
		lines = append(lines, fmt.Sprintf("%s: unit=%s requests_per_unit=%d%s, shadow_mode: %t, quota_mode: %t\n",
			r.Path, unit, r.RequestsPerUnit, burst, r.ShadowMode, r.QuotaMode))
	})
	slices.Sort(lines)
	return strings.Join(lines, "")
}
