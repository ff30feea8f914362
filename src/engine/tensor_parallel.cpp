// launch_ranks: N copies of one command on 127.0.0.1 with MLX distributed's environment (the ring
// backend's MLX_RANK / MLX_HOSTFILE, a JSON list of each rank's "ip:port" list, as mlx.launch
// writes it; NCCL's NCCL_HOST_IP / NCCL_PORT / MLX_WORLD_SIZE), watched so that a rank failing or
// stalling makes the whole launch fail instead of leaving its peers blocked in a collective.
#include "engine/tensor_parallel.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "lmx/lmx.h"

namespace lmx {

namespace {

constexpr const char* kWhere = "tensor parallel";

// Free TCP ports on 127.0.0.1, held open together so they differ, then released for the ranks.
std::vector<int> free_ports(int n) {
  std::vector<int> fds, ports;
  for (int i = 0; i < n; ++i) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    check(fd >= 0, kWhere, "cannot open a socket to pick a port");
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    check(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
              getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0,
          kWhere, "cannot bind a port on 127.0.0.1");
    fds.push_back(fd);
    ports.push_back(ntohs(a.sin_port));
  }
  for (int fd : fds) close(fd);
  return ports;
}

std::string write_hostfile(const std::vector<int>& ports) {
  std::string path = (std::filesystem::temp_directory_path() / "lmx-tp-XXXXXX").string();
  int fd = mkstemp(path.data());
  check(fd >= 0, kWhere, "cannot create the hostfile ", path);
  close(fd);
  std::ofstream f(path);
  f << "[";
  for (size_t i = 0; i < ports.size(); ++i)
    f << (i ? ", " : "") << "[\"127.0.0.1:" << ports[i] << "\"]";
  f << "]\n";
  check(f.good(), kWhere, "cannot write the hostfile ", path);
  return path;
}

struct Rank {
  pid_t pid = -1;
  int ready_fd = -1;  // read end; one byte when the rank is ready, EOF when it exits
  bool ready = false;
  bool exited = false;
  int status = 0;
};

std::string describe(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "was killed by signal " + std::to_string(WTERMSIG(status));
  return "stopped";
}

void stop_all(std::vector<Rank>& ranks) {
  for (auto& r : ranks) {
    if (r.pid <= 0) r.exited = true;  // never started: nothing to signal (kill(-1) is everyone)
    if (!r.exited) kill(r.pid, SIGTERM);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  for (auto& r : ranks) {
    while (!r.exited) {
      if (waitpid(r.pid, &r.status, WNOHANG) == r.pid) {
        r.exited = true;
      } else if (std::chrono::steady_clock::now() > deadline) {
        kill(r.pid, SIGKILL);
        waitpid(r.pid, &r.status, 0);
        r.exited = true;
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
    if (r.ready_fd >= 0) close(r.ready_fd);
    r.ready_fd = -1;
  }
}

// The environment of one rank: ours plus MLX distributed's, replacing inherited values.
std::vector<std::string> rank_env(int rank, int size, const std::string& hostfile, int port0) {
  const std::vector<std::pair<std::string, std::string>> vars{
      {"LMX_TP_RANK", std::to_string(rank)},
      {"LMX_TP_SIZE", std::to_string(size)},
      {"MLX_RANK", std::to_string(rank)},
      {"MLX_WORLD_SIZE", std::to_string(size)},
      {"MLX_HOSTFILE", hostfile},
      {"NCCL_HOST_IP", "127.0.0.1"},
      {"NCCL_PORT", std::to_string(port0)},
      {"NCCL_NVLS_ENABLE", "0"},  // NVLink multicast stays off in every process
  };
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    const std::string kv = *e;
    const std::string key = kv.substr(0, kv.find('='));
    bool ours = key == "LMX_TP_READY_FD";
    for (const auto& [k, v] : vars) ours = ours || k == key;
    if (!ours) env.push_back(kv);
  }
  for (const auto& [k, v] : vars) env.push_back(k + "=" + v);
  return env;
}

// After fork: only async-signal-safe calls until exec.
[[noreturn]] void exec_rank(std::vector<char*>& argv, std::vector<std::string>& env, int rank,
                            int ready_fd, pid_t launcher) {
  // A rank outliving its launcher would wait in a collective forever.
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (getppid() != launcher) _exit(1);
  // dup() drops O_CLOEXEC: this rank's write end (and no other) survives exec.
  const int fd = dup(ready_fd);
  char fd_var[32];
  std::snprintf(fd_var, sizeof(fd_var), "LMX_TP_READY_FD=%d", fd);
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(fd_var);
  envp.push_back(nullptr);
  if (rank > 0) {
    const int devnull = open("/dev/null", O_WRONLY);
    if (devnull >= 0) dup2(devnull, STDOUT_FILENO);
  }
  execve(argv[0], argv.data(), envp.data());
  const char msg[] = "lmx: error: [tensor parallel] cannot execute the rank's command\n";
  if (write(STDERR_FILENO, msg, sizeof(msg) - 1) < 0) _exit(127);
  _exit(127);
}

}  // namespace

void launch_ranks(const std::vector<std::string>& argv, const LaunchOptions& opt) {
  check(!argv.empty(), kWhere, "no command to launch");
  check(opt.ranks >= 1, kWhere, "the number of ranks must be >= 1, got ", opt.ranks);
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  const std::vector<int> ports = free_ports(opt.ranks);
  const std::string hostfile = write_hostfile(ports);
  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<std::string> args = argv;
  std::vector<char*> cargs;
  for (auto& a : args) cargs.push_back(a.data());
  cargs.push_back(nullptr);
  std::vector<Rank> ranks(opt.ranks);
  const pid_t launcher = getpid();
  for (int i = 0; i < opt.ranks; ++i) {
    std::vector<std::string> env = rank_env(i, opt.ranks, hostfile, ports[0]);
    int p[2];
    check(pipe2(p, O_CLOEXEC) == 0, kWhere, "cannot create a pipe for rank ", i);
    const pid_t pid = fork();
    if (pid == 0) exec_rank(cargs, env, i, p[1], launcher);
    close(p[1]);
    ranks[i].ready_fd = p[0];
    if (pid < 0) {
      stop_all(ranks);
      std::filesystem::remove(hostfile);
      fail(kWhere, "cannot start rank ", i);
    }
    ranks[i].pid = pid;
  }
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<long>(opt.startup_timeout_s * 1000));
  std::string error;
  for (;;) {
    int running = 0, ready = 0;
    for (int i = 0; i < opt.ranks && error.empty(); ++i) {
      Rank& r = ranks[i];
      if (!r.ready && r.ready_fd >= 0) {
        pollfd pf{r.ready_fd, POLLIN, 0};
        char byte;
        if (poll(&pf, 1, 0) > 0 && read(r.ready_fd, &byte, 1) == 1) r.ready = true;
      }
      if (!r.exited && waitpid(r.pid, &r.status, WNOHANG) == r.pid) {
        r.exited = true;
        if (!WIFEXITED(r.status) || WEXITSTATUS(r.status) != 0)
          error = "rank " + std::to_string(i) + " of " + std::to_string(opt.ranks) + " " +
                  describe(r.status) + (r.ready ? "" : " during start-up");
      }
      running += !r.exited;
      ready += r.ready || r.exited;
    }
    if (!error.empty() || running == 0) break;
    if (ready < opt.ranks && std::chrono::steady_clock::now() > deadline) {
      std::string late;
      for (int i = 0; i < opt.ranks; ++i)
        if (!ranks[i].ready && !ranks[i].exited)
          late += (late.empty() ? "" : ", ") + std::to_string(i);
      std::ostringstream os;
      os << "rank(s) " << late << " not ready after " << opt.startup_timeout_s
         << " s (the start-up timeout)";
      error = os.str();
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  stop_all(ranks);
  std::filesystem::remove(hostfile);
  check(error.empty(), kWhere, error, "; the other ranks were stopped");
}

std::optional<int> tensor_parallel_rank() {
  const char* r = std::getenv("LMX_TP_RANK");
  if (!r) return std::nullopt;
  return std::atoi(r);
}

void notify_rank_ready() {
  const char* fd = std::getenv("LMX_TP_READY_FD");
  if (!fd) return;
  const int f = std::atoi(fd);
  const char byte = 1;
  if (write(f, &byte, 1) == 1) close(f);
  unsetenv("LMX_TP_READY_FD");
}

ShardSpec join_tensor_parallel_group(int size) {
  const char* env_size = std::getenv("LMX_TP_SIZE");
  const std::optional<int> rank = tensor_parallel_rank();
  check(rank && env_size, kWhere, "tensor_parallel ", size,
        " needs a process started by lmx::launch_ranks (LMX_TP_RANK / LMX_TP_SIZE are unset)");
  check(std::atoi(env_size) == size, kWhere, "the load asks for tensor_parallel ", size,
        ", expected the launched group size ", env_size);
  const bool cuda = std::string(LMX_BACKEND) == "cuda";
  if (cuda) {
    // One GPU per rank: the one MLX's NCCL backend selects for itself (cudaSetDevice(rank % n)).
    const int gpus = mx::gpu::device_count();
    check(gpus >= size, kWhere, "--tp ", size, " needs one GPU per rank, got ", gpus, " GPUs");
    mx::set_default_device(mx::Device(mx::Device::gpu, *rank));
  }
  std::optional<mx::distributed::Group> group;
  try {
    group = mx::distributed::init(/*strict=*/true, cuda ? "nccl" : "ring");
  } catch (const std::exception& e) {
    fail(kWhere, "rank ", *rank, " could not join the ", cuda ? "NCCL" : "ring",
         " group: ", e.what());
  }
  check(group->size() == size && group->rank() == *rank, kWhere, "MLX distributed gave rank ",
        group->rank(), " of ", group->size(), ", expected rank ", *rank, " of ", size);
  return ShardSpec{*rank, size, group};
}

std::string broadcast_from_rank0(const std::string& payload, const mx::distributed::Group& group) {
  const bool root = group.rank() == 0;
  mx::array n = mx::distributed::all_sum(
      mx::array({root ? static_cast<int32_t>(payload.size()) : 0}, mx::int32), group);
  const int size = n.item<int32_t>();
  if (size == 0) return "";
  std::vector<int32_t> words((size + 3) / 4, 0);
  if (root) std::memcpy(words.data(), payload.data(), payload.size());
  mx::array sum = mx::distributed::all_sum(
      mx::array(words.data(), {static_cast<int>(words.size())}, mx::int32), group);
  mx::eval(sum);
  return std::string(reinterpret_cast<const char*>(sum.data<int32_t>()), size);
}

}  // namespace lmx
