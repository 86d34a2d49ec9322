#include "chorus/runtime/launch/identity.h"

#include <unistd.h>

#include <gtest/gtest.h>

#include "chorus/core/error.h"

namespace chorus::runtime {
namespace {

TEST(Identity, AProcessStartedByHandIsAJobOfOne) {
  const WorkerIdentity identity = identityFromEnvironment({});
  EXPECT_EQ(identity.rank, 0);
  EXPECT_EQ(identity.world_size, 1);
  EXPECT_EQ(identity.launcher, "none");
  EXPECT_FALSE(identity.hasStore());
  EXPECT_EQ(identity.device.kind, DeviceKind::kCpu);
}

TEST(Identity, ReadsWhatChorusRunSets) {
  const WorkerIdentity identity = identityFromEnvironment({
      {"CHORUS_RANK", "3"},
      {"CHORUS_WORLD_SIZE", "4"},
      {"CHORUS_LOCAL_RANK", "1"},
      {"CHORUS_LOCAL_WORLD_SIZE", "2"},
      {"CHORUS_NODE_RANK", "1"},
      {"CHORUS_NNODES", "2"},
      {"CHORUS_DEVICE", "cpu@0.5/512MiB"},
      {"CHORUS_RDZV_ENDPOINT", "10.0.0.1:29500"},
      {"CHORUS_SECRET_FD", "3"},
      {"CHORUS_BIND_ADDRESS", "10.0.0.2"},
      {"CHORUS_TIMEOUT_MS", "2500"},
  });
  EXPECT_EQ(identity.launcher, "chorus");
  EXPECT_EQ(identity.rank, 3);
  EXPECT_EQ(identity.world_size, 4);
  EXPECT_EQ(identity.local_rank, 1);
  EXPECT_EQ(identity.node_rank, 1);
  EXPECT_EQ(identity.nnodes, 2);
  EXPECT_EQ(identity.device.speed, 0.5);
  EXPECT_EQ(identity.store_host, "10.0.0.1");
  EXPECT_EQ(identity.store_port, 29500);
  EXPECT_EQ(identity.bind_address, "10.0.0.2");
  EXPECT_EQ(identity.host_id, "node1");
  EXPECT_EQ(identity.timeout_ms, 2500);
}

TEST(Identity, ReadsMpirunRanksAndPicksTheDeviceByLocalRank) {
  const WorkerIdentity identity = identityFromEnvironment({
      {"OMPI_COMM_WORLD_RANK", "5"},
      {"OMPI_COMM_WORLD_SIZE", "8"},
      {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
      {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
      {"CHORUS_DEVICES", "cuda:0,cuda:1,cuda:2,cuda:3"},
      {"CHORUS_RDZV_ENDPOINT", "[::1]:29500"},
      {"CHORUS_SECRET_FILE", "/etc/chorus/job.secret"},
  });
  EXPECT_EQ(identity.launcher, "mpirun");
  EXPECT_EQ(identity.rank, 5);
  EXPECT_EQ(identity.world_size, 8);
  // Open MPI names no host index: hosts are told apart by name.
  char host[256] = {};
  ASSERT_EQ(gethostname(host, sizeof host - 1), 0);
  EXPECT_EQ(identity.host_id, host);
  EXPECT_FALSE(identity.node_known);
  EXPECT_EQ(identity.device.kind, DeviceKind::kCuda);
  EXPECT_EQ(identity.device.index, 1);
  EXPECT_EQ(identity.store_host, "::1");
  EXPECT_EQ(identity.secret_file, "/etc/chorus/job.secret");
}

TEST(Identity, ReadsSlurmRanks) {
  const WorkerIdentity identity = identityFromEnvironment({
      {"SLURM_STEP_ID", "0"},
      {"SLURM_PROCID", "2"},
      {"SLURM_NTASKS", "3"},
      {"SLURM_LOCALID", "0"},
      {"SLURM_NTASKS_PER_NODE", "1"},
      {"SLURM_NODEID", "2"},
      {"SLURM_NNODES", "3"},
      {"CHORUS_RDZV_ENDPOINT", "head:29500"},
      {"CHORUS_SECRET_FD", "3"},
  });
  EXPECT_EQ(identity.launcher, "srun");
  EXPECT_EQ(identity.rank, 2);
  EXPECT_EQ(identity.node_rank, 2);
  EXPECT_EQ(identity.nnodes, 3);
}

// A batch script has SLURM_PROCID=0 and the job's SLURM_NTASKS too, but no step: it is no rank.
TEST(Identity, ASlurmBatchScriptIsNotARankOfItsJob) {
  const WorkerIdentity identity = identityFromEnvironment({
      {"SLURM_PROCID", "0"},
      {"SLURM_NTASKS", "3"},
      {"SLURM_LOCALID", "0"},
      {"SLURM_NODEID", "0"},
  });
  EXPECT_EQ(identity.launcher, "none");
  EXPECT_EQ(identity.world_size, 1);
}

TEST(Identity, TellsTheLauncherWithoutReadingTheRest) {
  EXPECT_EQ(launcherOf({}), "none");
  EXPECT_EQ(launcherOf({{"CHORUS_RANK", "1"}, {"OMPI_COMM_WORLD_RANK", "1"}}), "chorus");
  EXPECT_EQ(launcherOf({{"OMPI_COMM_WORLD_RANK", "1"}}), "mpirun");
  EXPECT_EQ(launcherOf({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "3"}}), "none");  // sbatch's shell
  EXPECT_EQ(launcherOf({{"SLURM_PROCID", "2"}, {"SLURM_STEP_ID", "0"}}), "srun");
  EXPECT_EQ(launcherOf({{"RANK", "1"}}), "none");  // not torchrun without its marker
  EXPECT_EQ(launcherOf({{"RANK", "1"}, {"TORCHELASTIC_RUN_ID", "j"}}), "torchrun");
}

TEST(Identity, SlurmRanksPerNodeComeFromTheStepsLayout) {
  const auto onNode = [](const char* node, const char* layout) {
    return identityFromEnvironment({
                                       {"SLURM_STEP_ID", "0"},
                                       {"SLURM_PROCID", "0"},
                                       {"SLURM_NTASKS", "7"},
                                       {"SLURM_LOCALID", "0"},
                                       {"SLURM_NODEID", node},
                                       {"SLURM_NNODES", "4"},
                                       {"SLURM_STEP_TASKS_PER_NODE", layout},
                                       {"CHORUS_RDZV_ENDPOINT", "head:29500"},
                                       {"CHORUS_SECRET_FILE", "/etc/chorus/job.secret"},
                                   })
        .local_world_size;
  };
  EXPECT_EQ(onNode("0", "2(x3),1"), 2);
  EXPECT_EQ(onNode("2", "2(x3),1"), 2);
  EXPECT_EQ(onNode("3", "2(x3),1"), 1);
  EXPECT_EQ(onNode("1", "3,4"), 4);
  EXPECT_THROW(onNode("3", "3,4"), ConfigError);
  EXPECT_THROW(onNode("0", "two"), ConfigError);
}

TEST(Identity, ReadsTorchrunRanksOnlyWithItsMarker) {
  const WorkerIdentity identity = identityFromEnvironment({
      {"TORCHELASTIC_RUN_ID", "job7"},
      {"RANK", "3"},
      {"WORLD_SIZE", "4"},
      {"LOCAL_RANK", "1"},
      {"LOCAL_WORLD_SIZE", "2"},
      {"GROUP_RANK", "1"},
      {"GROUP_WORLD_SIZE", "2"},
      {"CHORUS_RDZV_ENDPOINT", "head:29501"},
      {"CHORUS_SECRET_FILE", "/etc/chorus/job.secret"},
  });
  EXPECT_EQ(identity.launcher, "torchrun");
  EXPECT_EQ(identity.rank, 3);
  EXPECT_EQ(identity.world_size, 4);
  EXPECT_EQ(identity.local_rank, 1);
  EXPECT_EQ(identity.node_rank, 1);
  EXPECT_EQ(identity.nnodes, 2);
  // A RANK of something else is not torchrun's: a job of one.
  const WorkerIdentity alone = identityFromEnvironment({{"RANK", "3"}, {"WORLD_SIZE", "4"}});
  EXPECT_EQ(alone.launcher, "none");
  EXPECT_EQ(alone.world_size, 1);
}

TEST(Identity, RejectsInconsistentOrIncompleteIdentities) {
  EXPECT_THROW(identityFromEnvironment({{"CHORUS_RANK", "4"}, {"CHORUS_WORLD_SIZE", "4"}}),
               ConfigError);
  EXPECT_THROW(identityFromEnvironment({{"CHORUS_RANK", "x"}}), ConfigError);
  // Several workers but nowhere to meet.
  EXPECT_THROW(identityFromEnvironment({{"CHORUS_RANK", "0"}, {"CHORUS_WORLD_SIZE", "2"}}),
               ConfigError);
  // A store but no secret.
  EXPECT_THROW(identityFromEnvironment({{"CHORUS_RANK", "0"},
                                        {"CHORUS_WORLD_SIZE", "2"},
                                        {"CHORUS_RDZV_ENDPOINT", "127.0.0.1:1"}}),
               ConfigError);
}

// A replacement worker (chorus run --max-restarts) has a member id beyond the launch world size.
TEST(Identity, AReplacementHasAMemberIdBeyondTheWorldSizeAndNamesTheRankItReplaces) {
  const Environment replacement{{"CHORUS_RANK", "5"},
                                {"CHORUS_WORLD_SIZE", "3"},
                                {"CHORUS_LOCAL_RANK", "1"},
                                {"CHORUS_LOCAL_WORLD_SIZE", "3"},
                                {"CHORUS_ELASTIC_REPLACES", "1"},
                                {"CHORUS_RDZV_ENDPOINT", "127.0.0.1:1"},
                                {"CHORUS_SECRET_FD", "3"}};
  const WorkerIdentity identity = identityFromEnvironment(replacement);
  EXPECT_EQ(identity.rank, 5);
  EXPECT_EQ(identity.world_size, 3);
  EXPECT_EQ(identity.local_rank, 1);
  EXPECT_EQ(identity.replaces, 1);
  EXPECT_EQ(identityFromEnvironment({}).replaces, -1);
  // Not a replacement: the rank must still lie inside the world.
  Environment plain = replacement;
  plain.erase("CHORUS_ELASTIC_REPLACES");
  EXPECT_THROW(identityFromEnvironment(plain), ConfigError);
  // It replaces an earlier member, never itself or a later one, and never a negative rank.
  for (const char* bad : {"5", "6", "-1", "x"}) {
    Environment wrong = replacement;
    wrong["CHORUS_ELASTIC_REPLACES"] = bad;
    EXPECT_THROW(identityFromEnvironment(wrong), ConfigError) << bad;
  }
}

// `chorus run --elastic` tells its workers so (the Python front's elastic_steps needs it); no
// other launcher keeps the others running when one fails, so there it is refused.
TEST(Identity, AnElasticAgentsWorkersKnowTheyMayRegroup) {
  const Environment chorus{{"CHORUS_RANK", "0"}, {"CHORUS_WORLD_SIZE", "1"}};
  EXPECT_FALSE(identityFromEnvironment(chorus).elastic);
  Environment elastic = chorus;
  elastic["CHORUS_ELASTIC"] = "1";
  EXPECT_TRUE(identityFromEnvironment(elastic).elastic);
  const Environment mpirun{
      {"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "1"}, {"CHORUS_ELASTIC", "1"}};
  try {
    identityFromEnvironment(mpirun);
    FAIL() << "CHORUS_ELASTIC under mpirun was accepted";
  } catch (const ConfigError& error) {
    EXPECT_NE(std::string(error.what()).find("CHORUS_ELASTIC"), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("mpirun"), std::string::npos) << error.what();
  }
}

TEST(Identity, TakesTheSecretFromAnInheritedDescriptorOrAFile) {
  EXPECT_EQ(identityFromEnvironment({{"CHORUS_RANK", "0"},
                                     {"CHORUS_WORLD_SIZE", "2"},
                                     {"CHORUS_RDZV_ENDPOINT", "127.0.0.1:1"},
                                     {"CHORUS_SECRET_FD", "7"}})
                .secret_fd,
            7);
  EXPECT_EQ(identityFromEnvironment({{"CHORUS_RANK", "0"}}).secret_fd, -1);
  EXPECT_THROW(identityFromEnvironment({{"CHORUS_SECRET_FD", "-1"}}), ConfigError);
}

TEST(Identity, RefusesASecretInTheEnvironmentAndSaysWhy) {
  try {
    identityFromEnvironment({{"CHORUS_RANK", "0"},
                             {"CHORUS_WORLD_SIZE", "2"},
                             {"CHORUS_RDZV_ENDPOINT", "127.0.0.1:1"},
                             {"CHORUS_JOB_SECRET", "0123456789abcdef0123"}});
    FAIL() << "accepted a secret in the environment";
  } catch (const ConfigError& error) {
    EXPECT_NE(error.message().find("/proc/PID/environ"), std::string::npos) << error.message();
    EXPECT_NE(error.message().find("CHORUS_SECRET_FILE"), std::string::npos) << error.message();
    // The message must not echo the secret.
    EXPECT_EQ(error.message().find("0123456789abcdef0123"), std::string::npos) << error.message();
  }
}

TEST(Identity, AStoreInEtcdIsAListOfEndpointsTheFirstOfWhichIsRoutedTo) {
  const Environment chorus_run = {{"CHORUS_RANK", "1"},
                                  {"CHORUS_WORLD_SIZE", "2"},
                                  {"CHORUS_SECRET_FD", "3"},
                                  {"CHORUS_RDZV_BACKEND", "etcd"},
                                  {"CHORUS_RDZV_ENDPOINT", "10.0.0.5:2379,10.0.0.6:2379"}};
  const WorkerIdentity identity = identityFromEnvironment(chorus_run);
  EXPECT_EQ(identity.store_backend, "etcd");
  EXPECT_EQ(identity.etcd_endpoints, (std::vector<std::string>{"10.0.0.5:2379", "10.0.0.6:2379"}));
  EXPECT_EQ(identity.store_host, "10.0.0.5");
  EXPECT_EQ(identity.store_port, 2379);
  EXPECT_EQ(identityFromEnvironment({}).store_backend, "tcp");
  Environment unknown = chorus_run;
  unknown["CHORUS_RDZV_BACKEND"] = "zookeeper";
  EXPECT_THROW(identityFromEnvironment(unknown), ConfigError);
  Environment malformed = chorus_run;
  malformed["CHORUS_RDZV_ENDPOINT"] = "10.0.0.5:2379,";
  EXPECT_THROW(identityFromEnvironment(malformed), ConfigError);
}

TEST(Identity, ParsesEndpointsAndRejectsBadOnes) {
  EXPECT_EQ(parseEndpoint("127.0.0.1:29500"), std::make_pair(std::string("127.0.0.1"), 29500));
  EXPECT_EQ(parseEndpoint("[fe80::1]:1"), std::make_pair(std::string("fe80::1"), 1));
  for (const char* bad : {"", "host", ":29500", "host:", "host:70000", "host:12ab"})
    EXPECT_THROW(parseEndpoint(bad), ConfigError) << bad;
}

}  // namespace
}  // namespace chorus::runtime
