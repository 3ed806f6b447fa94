"""Head types, kept importable here: they live in the core as `interp.head_types` (they import only core
modules, and the pattern substitutions of `interp.interventions` use their ideal patterns). Every name of that
module is the same object here, so `from interp.analyses.head_types import HeadType, register` and
`register(HeadType(...))` keep working, and a type registered through either module is in the one registry."""
# `name as name`: an explicit re-export (mypy implicit_reexport = false)
from interp.head_types import BUILTIN_HEAD_TYPES as BUILTIN_HEAD_TYPES
from interp.head_types import CLARK as CLARK
from interp.head_types import DUPLICATE as DUPLICATE
from interp.head_types import ELHAGE as ELHAGE
from interp.head_types import HEAD_TYPES as HEAD_TYPES
from interp.head_types import NEEDS as NEEDS
from interp.head_types import OLSSON as OLSSON
from interp.head_types import RESERVED as RESERVED
from interp.head_types import SINK as SINK
from interp.head_types import TIE_TOLERANCE as TIE_TOLERANCE
from interp.head_types import VOITA as VOITA
from interp.head_types import Fallback as Fallback
from interp.head_types import FirstTarget as FirstTarget
from interp.head_types import HeadType as HeadType
from interp.head_types import HeadTypeParams as HeadTypeParams
from interp.head_types import Needs as Needs
from interp.head_types import OffsetTarget as OffsetTarget
from interp.head_types import PlainParams as PlainParams
from interp.head_types import ShuffleExpect as ShuffleExpect
from interp.head_types import Target as Target
from interp.head_types import TargetBatch as TargetBatch
from interp.head_types import WindowTarget as WindowTarget
from interp.head_types import argmax_ties as argmax_ties
from interp.head_types import duplicate_target as duplicate_target
from interp.head_types import get_head_type as get_head_type
from interp.head_types import head_type_reducer as head_type_reducer
from interp.head_types import head_types as head_types
from interp.head_types import ideal_head_type as ideal_head_type
from interp.head_types import ideal_pattern_names as ideal_pattern_names
from interp.head_types import induction_target as induction_target
from interp.head_types import offset_target as offset_target
from interp.head_types import offset_type as offset_type
from interp.head_types import reduce_head_types as reduce_head_types
from interp.head_types import register as register
from interp.head_types import repeat_queries_of as repeat_queries_of
from interp.head_types import try_head_type as try_head_type
from interp.head_types import unregister as unregister

