// lemon_tp: time LEMON min-cost-flow solvers on a dense n x m transportation problem.
// Instance is generated with splitmix64 so another language can rebuild it bit-for-bit:
//   state = seed; next(): state += 0x9E3779B97F4A7C15; z = state;
//     z = (z ^ (z>>30)) * 0xBF58476D1CE4E5B9; z = (z ^ (z>>27)) * 0x94D049BB133111EB; return z ^ (z>>31)
//   draw order: cost[i][j] for i in 0..n-1, j in 0..m-1 : 1 + next()%maxcost   (row-major)
//               then (mode=rand) supply[i] = 1 + next()%100 for i, w[j] = 1 + next()%100 for j,
//               demand[j] = floor(S*w[j]/W), remainder R = S - sum demand added +1 to j = 0..R-1.
//               (mode=uniform) supply[i] = 10*m, demand[j] = 10*n (no draws).
// Nodes: sources 0..n-1 (supply +s_i), sinks n..n+m-1 (supply -d_j). Arcs i->n+j, uncapacitated.
// Usage: lemon_tp n m seed [rand|uniform] [maxcost] [reps] [algo] [--dimacs out.min]
// Output: one line per algo with key=value fields; solve_ms_each lists every
// rep's solve time (ms, 6 decimals) in run order, for benchsolver's medians.
// With --serve (ns only) it builds the graph once, then for every line "K"
// on stdin runs K NetworkSimplex solves and prints one line
// "total_cost=C optimal=1 solve_ms_each=t1,...,tK run_ms_each=r1,...,rK"; EOF
// or "q" ends it. t is a whole solve (construct NetworkSimplex, which shuffles
// the arcs, set the maps, run(), totalCost()); r is run() alone, timed inside
// the same solve. This lets benchsolver interleave LEMON and edgeflow rep by rep.
// (edgeflow's copy of the reference LEMON harness: same generator, same ns*
// rows, plus --serve and solve_ms_each.)
//   algo: ns (NetworkSimplex, block search, default) | ns-first | ns-best | ns-cand | ns-alt |
//         cost (CostScaling) | cap (CapacityScaling) | all
//   The ns* rows time construction + run(); add the suffix "-run" (e.g. ns-run, ns-cand-run) to
//   build the solver and set its maps outside the timer and time run() alone: the strictest anchor.
#include <lemon/smart_graph.h>
#include <lemon/network_simplex.h>
#include <lemon/cost_scaling.h>
#include <lemon/capacity_scaling.h>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

using namespace lemon;
typedef SmartDigraph G;
typedef std::chrono::steady_clock Clk;

static uint64_t sm_state;
static uint64_t next_u64() {
  uint64_t z = (sm_state += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}
static double ms_since(Clk::time_point t) {
  return std::chrono::duration<double, std::milli>(Clk::now() - t).count();
}

struct Inst { int n, m; std::vector<long long> cost, sup, dem; };

static Inst make(int n, int m, uint64_t seed, bool uniform, long long maxcost) {
  Inst I; I.n = n; I.m = m; sm_state = seed;
  I.cost.resize((size_t)n * m);
  for (size_t k = 0; k < I.cost.size(); ++k) I.cost[k] = 1 + (long long)(next_u64() % (uint64_t)maxcost);
  I.sup.resize(n); I.dem.resize(m);
  if (uniform) {
    for (int i = 0; i < n; ++i) I.sup[i] = 10LL * m;
    for (int j = 0; j < m; ++j) I.dem[j] = 10LL * n;
  } else {
    long long S = 0, W = 0, D = 0;
    for (int i = 0; i < n; ++i) { I.sup[i] = 1 + (long long)(next_u64() % 100); S += I.sup[i]; }
    std::vector<long long> w(m);
    for (int j = 0; j < m; ++j) { w[j] = 1 + (long long)(next_u64() % 100); W += w[j]; }
    for (int j = 0; j < m; ++j) { I.dem[j] = S * w[j] / W; D += I.dem[j]; }
    for (long long r = 0; r < S - D; ++r) I.dem[r % m] += 1;
  }
  return I;
}

template <typename Solver>
static void set_and_run(Solver& s, G::ArcMap<long long>& c, G::NodeMap<long long>& sp,
                        typename Solver::ProblemType* pt) {
  s.costMap(c).supplyMap(sp);
  *pt = s.run();
}

int main(int argc, char** argv) {
  if (argc < 4) { fprintf(stderr, "usage: %s n m seed [rand|uniform] [maxcost] [reps] [algo] [--dimacs out.min]\n", argv[0]); return 2; }
  int n = atoi(argv[1]), m = atoi(argv[2]);
  uint64_t seed = strtoull(argv[3], 0, 10);
  bool uniform = argc > 4 && !strcmp(argv[4], "uniform");
  long long maxcost = argc > 5 ? atoll(argv[5]) : 1000;
  int reps = argc > 6 ? atoi(argv[6]) : 5;
  std::string algo = argc > 7 ? argv[7] : "ns";
  const char* dimacs = 0;
  for (int a = 1; a + 1 < argc; ++a) if (!strcmp(argv[a], "--dimacs")) dimacs = argv[a + 1];
  bool serve = false;
  for (int a = 1; a < argc; ++a) if (!strcmp(argv[a], "--serve")) serve = true;

  auto t0 = Clk::now();
  Inst I = make(n, m, seed, uniform, maxcost);
  double gen_ms = ms_since(t0);

  t0 = Clk::now();
  G g; g.reserveNode(n + m); g.reserveArc((size_t)n * m);
  std::vector<G::Node> v(n + m);
  for (int k = 0; k < n + m; ++k) v[k] = g.addNode();
  G::ArcMap<long long> cost(g);
  G::NodeMap<long long> sup(g);
  for (int i = 0; i < n; ++i) sup[v[i]] = I.sup[i];
  for (int j = 0; j < m; ++j) sup[v[n + j]] = -I.dem[j];
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < m; ++j) { G::Arc a = g.addArc(v[i], v[n + j]); cost[a] = I.cost[(size_t)i * m + j]; }
  double build_ms = ms_since(t0);

  if (dimacs) {  // DIMACS min-cost-flow format, 1-based nodes, capacity = total supply
    long long S = 0; for (long long s : I.sup) S += s;
    std::ofstream o(dimacs);
    o << "c lemon_tp n=" << n << " m=" << m << " seed=" << seed << (uniform ? " uniform" : " rand") << "\n";
    o << "p min " << (n + m) << " " << (long long)n * m << "\n";
    for (int i = 0; i < n; ++i) o << "n " << i + 1 << " " << I.sup[i] << "\n";
    for (int j = 0; j < m; ++j) o << "n " << n + j + 1 << " " << -I.dem[j] << "\n";
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < m; ++j) o << "a " << i + 1 << " " << n + j + 1 << " 0 " << S << " " << I.cost[(size_t)i * m + j] << "\n";
  }

  if (serve) {
    typedef NetworkSimplex<G, long long, long long> NS;
    char line[64];
    printf("ready gen_ms=%.3f build_ms=%.3f\n", gen_ms, build_ms);
    fflush(stdout);
    while (fgets(line, sizeof line, stdin) && line[0] != 'q') {
      int k = atoi(line);
      std::string each, runEach;
      long long total = -1; int status = -1;
      for (int r = 0; r < k; ++r) {
        auto t1 = Clk::now();
        NS s(g);
        s.costMap(cost).supplyMap(sup);
        auto t2 = Clk::now();
        NS::ProblemType p = s.run(NS::BLOCK_SEARCH);
        double run_ms = ms_since(t2);
        status = (p == NS::OPTIMAL); total = s.totalCost();
        double ms = ms_since(t1);
        char buf[32];
        snprintf(buf, sizeof buf, r ? ",%.6f" : "%.6f", ms);
        each += buf;
        snprintf(buf, sizeof buf, r ? ",%.6f" : "%.6f", run_ms);
        runEach += buf;
      }
      printf("total_cost=%lld optimal=%d solve_ms_each=%s run_ms_each=%s\n", total, status, each.c_str(),
             runEach.c_str());
      fflush(stdout);
    }
    return 0;
  }

  std::vector<std::string> algos;
  if (algo == "all") algos = {"ns", "ns-first", "ns-best", "ns-cand", "ns-alt", "cost", "cap"};
  else algos = {algo};

  for (const std::string& al : algos) {
    std::vector<double> t; long long total = -1; int status = -1;
    for (int r = 0; r < reps; ++r) {
      auto t1 = Clk::now();
      if (al.rfind("ns", 0) == 0) {
        typedef NetworkSimplex<G, long long, long long> NS;
        bool runOnly = al.size() > 4 && al.compare(al.size() - 4, 4, "-run") == 0;
        std::string rule = runOnly ? al.substr(0, al.size() - 4) : al;
        NS::PivotRule pr = NS::BLOCK_SEARCH;
        if (rule == "ns-first") pr = NS::FIRST_ELIGIBLE;
        else if (rule == "ns-best") pr = NS::BEST_ELIGIBLE;
        else if (rule == "ns-cand") pr = NS::CANDIDATE_LIST;
        else if (rule == "ns-alt") pr = NS::ALTERING_LIST;
        NS s(g);
        s.costMap(cost).supplyMap(sup);
        if (runOnly) t1 = Clk::now();
        NS::ProblemType p = s.run(pr);
        if (runOnly) t.push_back(ms_since(t1));
        status = (p == NS::OPTIMAL); total = s.totalCost();
        if (runOnly) continue;
      } else if (al == "cost") {
        CostScaling<G, long long, long long> s(g);
        s.costMap(cost).supplyMap(sup);
        status = (s.run() == CostScaling<G, long long, long long>::OPTIMAL); total = s.totalCost();
      } else if (al == "cap") {
        CapacityScaling<G, long long, long long> s(g);
        s.costMap(cost).supplyMap(sup);
        status = (s.run() == CapacityScaling<G, long long, long long>::OPTIMAL); total = s.totalCost();
      } else { fprintf(stderr, "unknown algo %s\n", al.c_str()); return 2; }
      t.push_back(ms_since(t1));
    }
    std::string each;
    for (size_t r = 0; r < t.size(); ++r) {
      char buf[32];
      snprintf(buf, sizeof buf, r ? ",%.6f" : "%.6f", t[r]);
      each += buf;
    }
    std::sort(t.begin(), t.end());
    printf("n=%d m=%d arcs=%lld mode=%s maxcost=%lld seed=%llu algo=%s optimal=%d total_cost=%lld "
           "gen_ms=%.3f build_ms=%.3f solve_ms_min=%.3f solve_ms_median=%.3f solve_ms_max=%.3f reps=%d "
           "solve_ms_each=%s\n",
           n, m, (long long)n * m, uniform ? "uniform" : "rand", maxcost, (unsigned long long)seed, al.c_str(),
           status, total, gen_ms, build_ms, t.front(), t[t.size() / 2], t.back(), reps, each.c_str());
    fflush(stdout);
  }
  return 0;
}
