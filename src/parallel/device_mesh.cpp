#include "parallel/device_mesh.h"

#include <fmt/format.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"

namespace lattice {
namespace {

void validate_axes(const MeshShape& shape) {
  const std::pair<const char*, int> axes[] = {{"pp", shape.pp}, {"dp", shape.dp}, {"tp", shape.tp}};
  for (const auto& [axis, size] : axes) {
    if (size < 1) {
      LATTICE_THROW(ConfigError,
                    "mesh {}: {} is {}, but every axis needs at least one rank ---> HINT: set "
                    "--{} to a positive count (1 turns that parallelism off)",
                    shape.to_string(), axis, size, axis);
    }
  }
}

const MeshShape& validated(const MeshShape& shape, int world_size) {
  validate_mesh(shape, world_size);
  return shape;
}

// A split of `world` into groups along one axis: `color` numbers the group (the other two
// coordinates), `key` orders ranks within it (the axis' own coordinate).
Communicator split_axis(Communicator& world, int color, int key, std::string name) {
  Communicator group = world.split(color, key);
  group.set_name(std::move(name));
  return group;
}

std::optional<Communicator> make_embedding_group(Communicator& pp, const MeshShape& shape,
                                                 const MeshCoordinates& at) {
  std::vector<int> stages{0};
  if (shape.pp > 1) stages.push_back(shape.pp - 1);
  std::optional<Communicator> group = pp.new_group(stages);
  if (group) group->set_name(fmt::format("embedding[dp{}·tp{}]", at.dp, at.tp));
  return group;
}

}  // namespace

std::string MeshShape::to_string() const {
  return fmt::format("pp{}·dp{}·tp{}", pp, dp, tp);
}

std::string MeshCoordinates::to_string() const {
  return fmt::format("pp{}·dp{}·tp{}", pp, dp, tp);
}

void validate_mesh(const MeshShape& shape, int world_size) {
  validate_axes(shape);
  const int64_t product = int64_t(shape.pp) * shape.dp * shape.tp;
  if (product != world_size) {
    LATTICE_THROW(ConfigError,
                  "mesh {} needs pp·dp·tp = {}·{}·{} = {} ranks, but the world has {} ---> HINT: "
                  "run {} ranks (e.g. `mpirun -np {}`), or choose --pp, --dp and --tp whose "
                  "product is {}",
                  shape.to_string(), shape.pp, shape.dp, shape.tp, product, world_size, product,
                  product, world_size);
  }
}

MeshCoordinates mesh_coordinates(const MeshShape& shape, int world_rank) {
  validate_axes(shape);
  if (world_rank < 0 || world_rank >= shape.world_size()) {
    LATTICE_THROW(ValueError, "world rank {} is outside mesh {}, whose ranks are 0..{}", world_rank,
                  shape.to_string(), shape.world_size() - 1);
  }
  MeshCoordinates at;
  at.tp = world_rank % shape.tp;
  at.dp = world_rank / shape.tp % shape.dp;
  at.pp = world_rank / (shape.tp * shape.dp);
  return at;
}

int mesh_rank(const MeshShape& shape, const MeshCoordinates& at) {
  validate_axes(shape);
  if (at.pp < 0 || at.pp >= shape.pp || at.dp < 0 || at.dp >= shape.dp || at.tp < 0 ||
      at.tp >= shape.tp) {
    LATTICE_THROW(ValueError, "coordinates {} are outside mesh {}", at.to_string(),
                  shape.to_string());
  }
  return (at.pp * shape.dp + at.dp) * shape.tp + at.tp;
}

DeviceMesh::DeviceMesh(Communicator& world, MeshShape shape)
    : world_(&world),
      shape_(validated(shape, world.size())),
      coordinates_(mesh_coordinates(shape_, world.rank())),
      tp_(split_axis(world, coordinates_.pp * shape_.dp + coordinates_.dp, coordinates_.tp,
                     fmt::format("tp[pp{}·dp{}]", coordinates_.pp, coordinates_.dp))),
      dp_(split_axis(world, coordinates_.pp * shape_.tp + coordinates_.tp, coordinates_.dp,
                     fmt::format("dp[pp{}·tp{}]", coordinates_.pp, coordinates_.tp))),
      pp_(split_axis(world, coordinates_.dp * shape_.tp + coordinates_.tp, coordinates_.pp,
                     fmt::format("pp[dp{}·tp{}]", coordinates_.dp, coordinates_.tp))),
      embedding_(make_embedding_group(pp_, shape_, coordinates_)) {}

}  // namespace lattice
