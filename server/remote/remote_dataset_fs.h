// A job's DatasetFs that also reads remote objects ("s3://bucket/key", "http(s)://..."):
// each is fetched whole into the node's ObjectCache (one download per node, whichever job
// asks first) and then opened or mapped from there; local paths go to the wrapped DatasetFs.
// An object over RemoteFsOptions::whole_object_max_bytes is opened, or mapped in ranges
// (MapFileInRanges), in blocks fetched with range reads as the reads need them
// (object_blocks.h); MapFile still fetches it whole.
//
// Contract:
//  * A job is served a cached object only once the store has let this filesystem's
//    credentials read that very version: the first open of each object asks the store for
//    its size and version (a HEAD), and the answer is remembered for this filesystem's life
//    (one per job), so the object's version stays the same for the whole job. A new version
//    is another cache entry. An object of a listed folder (below) that is not cached costs
//    one request instead: a GET of the version the listing gave (If-Match), whose success
//    proves the same; one that changed since the listing is asked for with a HEAD.
//  * The file or mapping returned holds the cache entry (it is not evicted) while it lives.
//  * A null `local` reads no local paths (PERMISSION_DENIED): a daemon with remote datasets
//    and no dataset_roots.
//  * ListDirectory of "s3://bucket/folder" lists every object whose key starts with
//    "folder/" (ListObjectsV2, all pages) and answers with the folder's files and
//    subfolders (the '/'-separated parts of the keys); the subfolders' entries are kept
//    and handed out, once each, to the ListDirectory calls that follow, so that an image
//    folder of many classes costs one listing. NOT_FOUND when no key starts so; HTTP
//    folders cannot be listed (UNIMPLEMENTED).
//
//   auto fs = MakeRemoteDatasetFs(local_fs, cache, store);
//   FERRY_ASSIGN_OR_RETURN(auto shard, fs->MapFile("s3://corpus/train-000042.bin"));
//
// Thread-safe, as every DatasetFs.
#ifndef FERRY_SERVER_REMOTE_REMOTE_DATASET_FS_H_
#define FERRY_SERVER_REMOTE_REMOTE_DATASET_FS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "server/cache/object_cache.h"
#include "server/dataset/dataset_fs.h"
#include "server/remote/store_client.h"

namespace ferry {

// Opens the remote ones of `paths` (objects: shards, .bin/.idx files) through `fs`, up to
// `connections` at once, starting them in the order given, and reads the first byte of
// each (for an object read in blocks, that fetches its first block), and stops starting
// more once the opened objects' bytes reach `max_bytes` (or fs.Stopping()); returns when
// those started are done. The cache then holds them, or the first block of those read in
// blocks, before a job's indexing opens them one by one. Best effort: what fails here
// fails again, with its error, where the job opens it.
void FetchAhead(const DatasetFs& fs, const std::vector<std::string>& paths, int connections,
                uint64_t max_bytes);

struct RemoteFsOptions {
  // Objects larger than this are read in blocks of block_bytes (server/remote/object_blocks.h)
  // by OpenFile and MapFileInRanges instead of fetched whole. Default: 1 GiB.
  uint64_t whole_object_max_bytes = uint64_t{1} << 30;
  // A multiple of the page size. Default: 16 MiB.
  uint64_t block_bytes = uint64_t{16} << 20;
  // Blocks one mapping keeps mapped once no read holds them. Default: 0, a quarter of the
  // cache's capacity.
  uint64_t max_held_bytes = 0;
  // An object fetched whole that is larger than part_bytes (and has a version, an ETag) is
  // fetched in parts of part_bytes, with range GETs of that version, at most
  // part_connections at once for all of this filesystem's fetches. Parts are handed their
  // turn in the order the fetches asked for them (an object's parts together), so the
  // object asked for first is fetched first, by all the connections. 0: one GET an object.
  uint64_t part_bytes = uint64_t{8} << 20;
  int part_connections = 16;
};

std::shared_ptr<const DatasetFs> MakeRemoteDatasetFs(std::shared_ptr<const DatasetFs> local,
                                                     std::shared_ptr<ObjectCache> cache,
                                                     std::shared_ptr<const StoreClient> store,
                                                     const RemoteFsOptions& options = {});

}  // namespace ferry

#endif  // FERRY_SERVER_REMOTE_REMOTE_DATASET_FS_H_
