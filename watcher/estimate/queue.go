package estimate

import "github.com/edgeflow/edgeflow/optimizer"

// mmcCapacity inverts the M/M/c queue: it returns the capacity c·μ₁ (requests/s) of the c-server
// queue whose mean sojourn time at arrival rate lambda (requests/s) is sojourn (seconds). For
// c = 1 that is λ + 1/S; for c > 1 μ₁ is found by bisection to a relative 1e-12 (the sojourn
// time falls strictly as μ₁ grows). lambda and sojourn must be positive and finite.
func mmcCapacity(lambda, sojourn float64, c int) float64 {
	if c == 1 {
		return lambda + 1/sojourn
	}
	cf := float64(c)
	// The sojourn time is more than the service time 1/μ₁ and infinite at μ₁ = λ/c.
	lo := max(lambda/cf, 1/sojourn)
	hi := 2 * lo
	for i := 0; i < 2100 && mmcSojourn(lambda, hi, c) > sojourn; i++ { // 2^2100 spans the float64s
		lo, hi = hi, 2*hi
	}
	for i := 0; i < 200 && hi-lo > 1e-12*hi; i++ { // the cap: for denormals, where 1e-12·hi is 0
		mid := lo + (hi-lo)/2
		if mmcSojourn(lambda, mid, c) > sojourn {
			lo = mid
		} else {
			hi = mid
		}
	}
	return cf * (lo + (hi-lo)/2)
}

// mmcSojourn is optimizer.MMcSojourn: the M/M/c queue's mean sojourn time, seconds.
func mmcSojourn(lambda, mu1 float64, c int) float64 { return optimizer.MMcSojourn(lambda, mu1, c) }
