// Contract: checkPickleStorages follows a pickle as torch::jit::Unpickler::readInstruction (torch
// 2.x, the one chorus links) does: its stack, marks, memo and table of globals. At each BINPERSID
// libtorch pops ('storage', type, key, location, count), reads record <dir>/<key> and makes a
// storage of count × element size bytes over a buffer of the record's size, comparing neither
// (fuzz/checkpoint_archive_fuzzer.cc: a SEGV in CPUGeneratorImpl::set_state). Refused, as
// CheckpointError "a checkpoint archive is damaged: ...", before libtorch reads the pickle:
//   - a storage with a negative count, with count × element size beyond its record, or with no
//     record and a positive count; a storage type that is no scalar type (libtorch indexes its
//     type tables with it: SIGFPE, SEGV);
//   - a memo index beyond the pickle's size (libtorch grows its memo to it, 16 bytes an entry);
//   - REDUCE or BUILD of _rebuild_from_type_v2 with no global after it (libtorch calls past its
//     table: SEGV);
//   - a storage the model cannot follow back to its values (below); no pickler writes one.
// Where libtorch refuses the pickle (an opcode it does not read, too few values or marks, a value
// of another type than it takes, the end of the bytes) the check returns, leaving it to libtorch.
// It reads each byte once, never recurses, and keeps a few words per opcode.
//
// What it cannot know: an enum's global (from the archive's own code/) called on a value none of
// its members has pushes nothing. So a REDUCE or BUILD result is kMaybeAbsent, and an opcode
// taking one off the stack makes the model forget the stack below it (kUnknown from then on).
#include "checkpoint/pickle_storages.h"

#include <algorithm>
#include <array>
#include <limits>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "checkpoint/pickle_unpickler.h"
#include "chorus/core/error.h"
#include "chorus/core/text.h"

namespace chorus::runtime {
namespace {

// The unpickler's vocabulary: its opcodes (kMark, ...), GlobalEffect and the storage types.
using namespace pickle;  // NOLINT(google-build-using-namespace): one file's private header

// What the model knows of a value on libtorch's stack.
enum class Kind : std::uint8_t {
  kInt,          // an int, its value known
  kString,       // a string, its bytes known
  kTuple,        // a tuple, its elements known
  kOther,        // there, and no int, string or tuple: None, bool, float, list, dict, tensor
  kUnknown,      // there, anything
  kMaybeAbsent,  // a REDUCE or BUILD result: an object or enum, or nothing (see above)
};

struct Value {
  Kind kind = Kind::kOther;
  std::int64_t number = 0;  // kInt
  std::size_t first = 0;    // kString: pickle bytes [first, first + size); kTuple: elements_
  std::size_t size = 0;
};
using ValueId = std::size_t;

Value intValue(std::int64_t number) {
  Value value;
  value.kind = Kind::kInt;
  value.number = number;
  return value;
}

Value stringValue(std::size_t first, std::size_t size) {
  Value value;
  value.kind = Kind::kString;
  value.first = first;
  value.size = size;
  return value;
}

Value tupleValue(std::size_t first, std::size_t size) {
  Value value;
  value.kind = Kind::kTuple;
  value.first = first;
  value.size = size;
  return value;
}

// A storage key as an error message shows it: printable, and not too long.
std::string printable(std::string_view text) {
  constexpr std::size_t kShown = 64;
  std::string out;
  for (char c : text.substr(0, kShown)) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte >= 0x20 && byte < 0x7f && c != '\\') {
      out += c;
    } else {
      constexpr char kHex[] = "0123456789abcdef";
      out += {'\\', 'x', kHex[byte >> 4], kHex[byte & 15]};
    }
  }
  if (text.size() > kShown) out += "...";
  return out;
}

// count × element_size bytes as text, also where it exceeds 64 bits.
std::string declaredBytes(std::int64_t count, std::size_t element_size) {
  const auto elements = static_cast<std::uint64_t>(count);
  if (elements > std::numeric_limits<std::uint64_t>::max() / element_size)
    return "over " + std::to_string(std::numeric_limits<std::uint64_t>::max());
  return std::to_string(elements * element_size);
}

// Records "data.pkl" keep their storages in "data/<key>" (found ignoring case, as the record).
std::string storageDirectory(const std::string& record) {
  const std::string_view suffix = ".pkl";
  if (endsWithIgnoringCase(record, suffix)) return record.substr(0, record.size() - suffix.size());
  return record;
}

class PickleModel {
 public:
  PickleModel(const std::string& record, std::string_view pickle,
              const RecordSizeLookup& record_size)
      : record_(record),
        directory_(storageDirectory(record)),
        pickle_(pickle),
        record_size_(record_size) {
    values_.resize(3);
    values_[kOtherId].kind = Kind::kOther;
    values_[kUnknownId].kind = Kind::kUnknown;
    values_[kMaybeAbsentId].kind = Kind::kMaybeAbsent;
  }

  // Follows the pickle to its STOP, or to where libtorch refuses it.
  void run() {
    std::uint8_t op = 0;
    std::uint64_t protocol = 0;
    if (!readByte(op) || op != kProto || !readLittleEndian(1, protocol) || protocol != 2) return;
    while (readByte(op)) {
      op_offset_ = pos_ - 1;
      if (!step(op)) return;
    }
  }

 private:
  static constexpr ValueId kOtherId = 0;
  static constexpr ValueId kUnknownId = 1;
  static constexpr ValueId kMaybeAbsentId = 2;

  // One opcode; false where libtorch stops reading: STOP, or a refusal.
  bool step(std::uint8_t op) {
    switch (op) {
      case kMark:
        marks_.push_back(stack_.size());
        return true;
      case kEmptyTuple:
        return push(add(tupleValue(elements_.size(), 0)));
      case kNone:
      case kEmptyList:
      case kEmptyDict:
      case kNewTrue:
      case kNewFalse:
        return push(kOtherId);
      case kBinFloat:
        return skip(8) && push(kOtherId);
      case kBinInt1:
        return pushUnsigned(1);
      case kBinInt2:
        return pushUnsigned(2);
      case kBinInt:
        return pushBinInt();
      case kLong1:
        return pushLong1();
      case kBinUnicode:
        return pushString(4);
      case kBinUnicode8:
        return pushString(8);
      case kTuple:
        return tupleFromMark();
      case kTuple1:
        return tupleOfTop(1);
      case kTuple2:
        return tupleOfTop(2);
      case kTuple3:
        return tupleOfTop(3);
      case kList:
      case kDict:
        return collectFromMark() && push(kOtherId);
      case kAppends:
      case kSetItems:
        return collectFromMark();
      case kAppend:
        return takeBelow(2, 1);  // the list stays, the value goes
      case kSetItem:
        return takeBelow(3, 2);  // the dict stays, the key and value go
      case kNewObj:
        return takeBelow(1, 1);
      case kBinPut:
        return memoPut(1);
      case kLongBinPut:
        return memoPut(4);
      case kBinGet:
        return memoGet(1);
      case kLongBinGet:
        return memoGet(4);
      case kGlobal:
        return global();
      case kReduce:
      case kBuild:
        return call();
      case kBinPersId:
        return persistentLoad();
      default:
        return false;  // STOP, or an opcode libtorch refuses
    }
  }

  // --- Reading the pickle; each is false at its end. ---

  bool readByte(std::uint8_t& byte) {
    if (pos_ >= pickle_.size()) return false;
    byte = static_cast<std::uint8_t>(pickle_[pos_++]);
    return true;
  }

  bool skip(std::size_t count) {
    if (pickle_.size() - pos_ < count) return false;
    pos_ += count;
    return true;
  }

  bool readLittleEndian(std::size_t width, std::uint64_t& value) {
    if (pickle_.size() - pos_ < width) return false;
    value = 0;
    for (std::size_t i = width; i-- > 0;)
      value = (value << 8) | static_cast<std::uint8_t>(pickle_[pos_ + i]);
    pos_ += width;
    return true;
  }

  bool readLine(std::string_view& line) {
    const std::size_t end = pickle_.find('\n', pos_);
    if (end == std::string_view::npos) return false;
    line = pickle_.substr(pos_, end - pos_);
    pos_ = end + 1;
    return true;
  }

  // --- Values ---

  ValueId add(Value value) {
    values_.push_back(value);
    return values_.size() - 1;
  }

  bool push(ValueId id) {
    stack_.push_back(id);
    return true;
  }

  bool pushInt(std::int64_t number) { return push(add(intValue(number))); }

  bool pushUnsigned(std::size_t width) {
    std::uint64_t number = 0;
    return readLittleEndian(width, number) && pushInt(static_cast<std::int64_t>(number));
  }

  bool pushBinInt() {
    std::uint64_t bits = 0;
    if (!readLittleEndian(4, bits)) return false;
    return pushInt(static_cast<std::int32_t>(static_cast<std::uint32_t>(bits)));
  }

  // LONG1: libtorch reads only 8-byte ones.
  bool pushLong1() {
    std::uint64_t length = 0, bits = 0;
    if (!readLittleEndian(1, length) || length != 8 || !readLittleEndian(8, bits)) return false;
    return pushInt(static_cast<std::int64_t>(bits));
  }

  bool pushString(std::size_t width) {
    std::uint64_t length = 0;
    if (!readLittleEndian(width, length) || pickle_.size() - pos_ < length) return false;
    const ValueId text = add(stringValue(pos_, static_cast<std::size_t>(length)));
    pos_ += static_cast<std::size_t>(length);
    return push(text);
  }

  bool mayBeAbsent(ValueId id) const { return values_[id].kind == Kind::kMaybeAbsent; }

  // --- The stack's shape ---

  // The model's stack holds libtorch's values in the same order, plus each kMaybeAbsent that
  // libtorch's holds not: never fewer. Forgetting it keeps that true: what lies below is unknown.
  void forgetStack() {
    stack_.clear();
    bottomless_ = true;
    forgetMarks();
  }

  void forgetMarks() {
    lost_marks_ += marks_.size();
    marks_.clear();
  }

  // Takes the top `count` (at most 3) values off the stack into `taken`, the deepest first.
  // False where libtorch's stack runs out. Where one of them may be absent, libtorch may have
  // taken one more from below: the model forgets the stack, and `taken` holds unknowns.
  bool popValues(std::size_t count, ValueId* taken) {
    if (stack_.size() < count && !bottomless_) return false;
    const std::size_t known = std::min(count, stack_.size());
    const auto top = stack_.end() - static_cast<std::ptrdiff_t>(known);
    if (std::any_of(top, stack_.end(), [&](ValueId id) { return mayBeAbsent(id); })) {
      forgetStack();
      std::fill(taken, taken + count, kUnknownId);
      return true;
    }
    std::fill(taken, taken + (count - known), kUnknownId);
    std::copy(top, stack_.end(), taken + (count - known));
    stack_.erase(top, stack_.end());
    if (known < count) forgetMarks();  // the marks no longer line up with libtorch's
    return true;
  }

  // APPEND, SETITEM, NEWOBJ: libtorch needs `depth` values and takes the top `count`.
  bool takeBelow(std::size_t depth, std::size_t count) {
    if (stack_.size() < depth && !bottomless_) return false;
    std::array<ValueId, 3> taken{};
    return popValues(count, taken.data());
  }

  // Where the values above the newest mark start in stack_, as TUPLE, LIST, DICT, APPENDS and
  // SETITEMS take them; nullopt where libtorch refuses (no mark, or a stack below it). With a
  // mark the model lost, it forgets the stack and `known` is false.
  struct Marked {
    std::size_t start;
    bool known;
  };
  std::optional<Marked> popMark() {
    if (!marks_.empty()) {
      const std::size_t start = marks_.back();
      marks_.pop_back();
      if (start > stack_.size()) return std::nullopt;
      return Marked{start, true};
    }
    if (lost_marks_ == 0) return std::nullopt;
    --lost_marks_;
    forgetStack();
    return Marked{0, false};
  }

  bool collectFromMark() {
    const std::optional<Marked> marked = popMark();
    if (!marked) return false;
    stack_.resize(marked->start);
    return true;
  }

  // --- Tuples ---

  template <typename Iterator>
  ValueId tupleOf(Iterator begin, Iterator end) {
    const std::size_t first = elements_.size();
    elements_.insert(elements_.end(), begin, end);
    return add(tupleValue(first, elements_.size() - first));
  }

  // TUPLE: unknown where a value in it may be absent (libtorch's is shorter) or the mark is lost.
  bool tupleFromMark() {
    const std::optional<Marked> marked = popMark();
    if (!marked) return false;
    const auto begin = stack_.begin() + static_cast<std::ptrdiff_t>(marked->start);
    const bool known = marked->known && std::none_of(begin, stack_.end(),
                                                     [&](ValueId id) { return mayBeAbsent(id); });
    const ValueId tuple = known ? tupleOf(begin, stack_.end()) : kUnknownId;
    stack_.resize(marked->start);
    return push(tuple);
  }

  // TUPLE1 to TUPLE3: a tuple of `count` values, unknown ones where the model lost track.
  bool tupleOfTop(std::size_t count) {
    std::array<ValueId, 3> taken{};
    if (!popValues(count, taken.data())) return false;
    return push(tupleOf(taken.begin(), taken.begin() + static_cast<std::ptrdiff_t>(count)));
  }

  // --- The memo ---

  bool memoPut(std::size_t width) {
    std::uint64_t index = 0;
    if (!readLittleEndian(width, index)) return false;
    if (index >= pickle_.size()) {
      refuse("stores memo entry ", index, " at offset ", op_offset_, ", more than a pickle of ",
             pickle_.size(), " bytes can have");
    }
    if (stack_.empty() && !bottomless_) return false;
    const bool known = !stack_.empty() && !mayBeAbsent(stack_.back());
    memo_[index] = known ? stack_.back() : kUnknownId;
    memo_size_ = std::max(memo_size_, index + 1);
    return true;
  }

  // An index below the largest stored that was never stored itself holds None in libtorch.
  bool memoGet(std::size_t width) {
    std::uint64_t index = 0;
    if (!readLittleEndian(width, index) || index >= memo_size_) return false;
    const auto entry = memo_.find(index);
    return push(entry == memo_.end() ? kOtherId : entry->second);
  }

  // --- Globals ---

  // readGlobal: after _rebuild_from_type_v2, the next GLOBAL is read as usual and the one after
  // it pushes the index of the newest global, whatever it names.
  bool global() {
    std::string_view module, name;
    if (!readLine(module) || !readLine(name)) return false;
    if (skipped_globals_ > 0 && --skipped_globals_ == 0) {
      return pushInt(static_cast<std::int64_t>(global_count_) - 1);
    }
    switch (globalEffect(module, name)) {
      case GlobalEffect::kRefused:
        return false;
      case GlobalEffect::kPushesInt:
        return pushInt(storageScalarType(name) ? *storageScalarType(name) : *qscheme(name));
      case GlobalEffect::kRegisters:
        return registerGlobal(false);
      case GlobalEffect::kFromTypeV2:
        skipped_globals_ = 2;
        return registerGlobal(true);
    }
    return false;
  }

  bool registerGlobal(bool from_type_v2) {
    ++global_count_;
    trailing_from_type_v2_ = from_type_v2 ? trailing_from_type_v2_ + 1 : 0;
    return pushInt(static_cast<std::int64_t>(global_count_) - 1);
  }

  // REDUCE and BUILD: libtorch calls global stack[-2] on stack[-1]. _rebuild_from_type_v2 calls
  // the global registered after it, unchecked: refused where there is none (a run of them at the
  // end of the table), or where the index is unknown and such a run exists.
  bool call() {
    std::array<ValueId, 2> taken{};
    if (!popValues(2, taken.data())) return false;
    const Value& index = values_[taken[0]];
    if (index.kind == Kind::kInt) {
      if (index.number < 0 || static_cast<std::uint64_t>(index.number) >= global_count_)
        return false;
      if (static_cast<std::uint64_t>(index.number) >= global_count_ - trailing_from_type_v2_)
        refuseDanglingRebuild();
    } else if (index.kind == Kind::kUnknown) {
      if (trailing_from_type_v2_ > 0) refuseDanglingRebuild();
    } else {
      return false;  // libtorch: the index is no int
    }
    return push(kMaybeAbsentId);
  }

  // --- Storages ---

  bool persistentLoad() {
    ValueId taken = kUnknownId;
    if (!popValues(1, &taken)) return false;
    const Kind kind = values_[taken].kind;
    if (kind == Kind::kUnknown) refuseUnfollowable();
    if (kind != Kind::kTuple || !checkStorage(values_[taken])) return false;
    return push(kOtherId);  // the storage's tensor
  }

  // The fields libtorch reads of a storage tuple, in its order.
  static constexpr std::array<Kind, 5> kStorageFields = {Kind::kString, Kind::kInt, Kind::kString,
                                                         Kind::kString, Kind::kInt};

  // False where libtorch refuses the tuple: too short, or a field of another type, or a first one
  // other than 'storage'.
  bool checkStorage(const Value& tuple) {
    if (tuple.size < kStorageFields.size()) return false;
    bool unknown = false;
    for (std::size_t i = 0; i < kStorageFields.size(); ++i) {
      const Value& field = element(tuple, i);
      if (field.kind == Kind::kUnknown) {
        unknown = true;
      } else if (field.kind != kStorageFields[i]) {
        return false;
      }
    }
    const Value& tag = element(tuple, 0);
    if (tag.kind == Kind::kString && text(tag) != "storage") return false;
    if (unknown) refuseUnfollowable();
    checkStorageSize(element(tuple, 1).number, text(element(tuple, 2)), element(tuple, 4).number);
    return true;
  }

  std::string_view text(const Value& string) const {
    return pickle_.substr(string.first, string.size);
  }

  const Value& element(const Value& tuple, std::size_t i) const {
    return values_[elements_[tuple.first + i]];
  }

  // libtorch reads the record only for a positive count.
  void checkStorageSize(std::int64_t scalar_type, std::string_view key, std::int64_t count) {
    const std::optional<std::size_t> element_size = elementSize(scalar_type);
    if (!element_size) {
      refuse("declares storage '", printable(key), "' at offset ", op_offset_,
             " with element type ", scalar_type, ", which is no storage type");
    }
    if (count < 0) {
      refuse("declares storage '", printable(key), "' at offset ", op_offset_, " with ", count,
             " elements");
    }
    if (count == 0) return;
    const std::string name = directory_ + "/" + std::string(key);
    const std::optional<std::uint64_t> bytes = record_size_(name);
    const std::string declared = declaredBytes(count, *element_size);
    if (!bytes) {
      refuse("declares storage '", printable(key), "' of ", declared, " bytes at offset ",
             op_offset_, ", but the archive has no record '", printable(name), "'");
    }
    if (static_cast<std::uint64_t>(count) > *bytes / *element_size) {
      refuse("declares storage '", printable(key), "' of ", declared, " bytes (", count,
             " elements of ", *element_size, ") at offset ", op_offset_, ", but its record '",
             printable(name), "' holds ", *bytes, " bytes");
    }
  }

  // --- Refusals ---

  template <typename... Parts>
  [[noreturn]] void refuse(const Parts&... parts) const {
    CHORUS_THROW(CheckpointError, "a checkpoint archive is damaged: its record '", record_, "' ",
                 parts...);
  }

  [[noreturn]] void refuseUnfollowable() const {
    refuse("declares a storage at offset ", op_offset_,
           " that cannot be followed back to the values it is made of (no pickler writes one)");
  }

  [[noreturn]] void refuseDanglingRebuild() const {
    refuse("calls _rebuild_from_type_v2 at offset ", op_offset_,
           " with no global after it to rebuild the tensor");
  }

  const std::string& record_;
  const std::string directory_;
  const std::string_view pickle_;
  const RecordSizeLookup& record_size_;
  std::size_t pos_ = 0;
  std::size_t op_offset_ = 0;

  std::vector<Value> values_;      // ids 0-2: kOtherId, kUnknownId, kMaybeAbsentId
  std::vector<ValueId> elements_;  // the tuples' elements
  std::vector<ValueId> stack_;
  bool bottomless_ = false;  // the model forgot what lies below stack_
  std::vector<std::size_t> marks_;
  std::size_t lost_marks_ = 0;  // marks below these, forgotten with the stack
  std::unordered_map<std::uint64_t, ValueId> memo_;
  std::uint64_t memo_size_ = 0;            // libtorch's memo table's size
  std::size_t global_count_ = 0;           // entries in libtorch's table of globals
  std::size_t trailing_from_type_v2_ = 0;  // _rebuild_from_type_v2 entries at its end
  int skipped_globals_ = 0;
};

}  // namespace

bool isPickleRecord(const std::string& name) { return endsWithIgnoringCase(name, "pkl"); }

void checkPickleStorages(const std::string& record, std::string_view pickle,
                         const RecordSizeLookup& record_size) {
  PickleModel(record, pickle, record_size).run();
}

}  // namespace chorus::runtime
