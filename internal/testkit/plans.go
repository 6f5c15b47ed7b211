package testkit

// Plans is the plans: block of the service's tests of plans, for a test to
// follow with its namespaces: free, 3 a minute, and pro, 50 a minute and
// 1,000 a day (in UTC).
const Plans = `plans:
  - name: free
    rate_limit: {unit: minute, requests_per_unit: 3}
  - name: pro
    rate_limit: {unit: minute, requests_per_unit: 50}
    quotas: [{period: day, allowance: 1000}]
`
