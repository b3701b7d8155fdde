/* pk_names.c: opcode and node-kind names for the VM's messages. */
#include "pk_vm.h"

const char *zck__pk_op_name(uint8_t op) {
  switch (op) {
  case ZPK_MARK: return "MARK"; case ZPK_STOP: return "STOP"; case ZPK_POP: return "POP";
  case ZPK_POP_MARK: return "POP_MARK"; case ZPK_DUP: return "DUP"; case ZPK_FLOAT: return "FLOAT";
  case ZPK_INT: return "INT"; case ZPK_BININT: return "BININT"; case ZPK_BININT1: return "BININT1";
  case ZPK_LONG: return "LONG"; case ZPK_BININT2: return "BININT2"; case ZPK_NONE: return "NONE";
  case ZPK_PERSID: return "PERSID"; case ZPK_BINPERSID: return "BINPERSID"; case ZPK_REDUCE: return "REDUCE";
  case ZPK_STRING: return "STRING"; case ZPK_BINSTRING: return "BINSTRING";
  case ZPK_SHORT_BINSTRING: return "SHORT_BINSTRING"; case ZPK_UNICODE: return "UNICODE";
  case ZPK_BINUNICODE: return "BINUNICODE"; case ZPK_APPEND: return "APPEND"; case ZPK_BUILD: return "BUILD";
  case ZPK_GLOBAL: return "GLOBAL"; case ZPK_DICT: return "DICT"; case ZPK_EMPTY_DICT: return "EMPTY_DICT";
  case ZPK_APPENDS: return "APPENDS"; case ZPK_GET: return "GET"; case ZPK_BINGET: return "BINGET";
  case ZPK_INST: return "INST"; case ZPK_LONG_BINGET: return "LONG_BINGET"; case ZPK_LIST: return "LIST";
  case ZPK_EMPTY_LIST: return "EMPTY_LIST"; case ZPK_OBJ: return "OBJ"; case ZPK_PUT: return "PUT";
  case ZPK_BINPUT: return "BINPUT"; case ZPK_LONG_BINPUT: return "LONG_BINPUT"; case ZPK_SETITEM: return "SETITEM";
  case ZPK_TUPLE: return "TUPLE"; case ZPK_EMPTY_TUPLE: return "EMPTY_TUPLE"; case ZPK_SETITEMS: return "SETITEMS";
  case ZPK_BINFLOAT: return "BINFLOAT"; case ZPK_PROTO: return "PROTO"; case ZPK_NEWOBJ: return "NEWOBJ";
  case ZPK_EXT1: return "EXT1"; case ZPK_EXT2: return "EXT2"; case ZPK_EXT4: return "EXT4";
  case ZPK_TUPLE1: return "TUPLE1"; case ZPK_TUPLE2: return "TUPLE2"; case ZPK_TUPLE3: return "TUPLE3";
  case ZPK_NEWTRUE: return "NEWTRUE"; case ZPK_NEWFALSE: return "NEWFALSE"; case ZPK_LONG1: return "LONG1";
  case ZPK_LONG4: return "LONG4"; case ZPK_BINBYTES: return "BINBYTES"; case ZPK_SHORT_BINBYTES: return "SHORT_BINBYTES";
  case ZPK_SHORT_BINUNICODE: return "SHORT_BINUNICODE"; case ZPK_BINUNICODE8: return "BINUNICODE8";
  case ZPK_BINBYTES8: return "BINBYTES8"; case ZPK_EMPTY_SET: return "EMPTY_SET"; case ZPK_ADDITEMS: return "ADDITEMS";
  case ZPK_FROZENSET: return "FROZENSET"; case ZPK_NEWOBJ_EX: return "NEWOBJ_EX";
  case ZPK_STACK_GLOBAL: return "STACK_GLOBAL"; case ZPK_MEMOIZE: return "MEMOIZE"; case ZPK_FRAME: return "FRAME";
  case ZPK_BYTEARRAY8: return "BYTEARRAY8"; case ZPK_NEXT_BUFFER: return "NEXT_BUFFER";
  case ZPK_READONLY_BUFFER: return "READONLY_BUFFER";
  default: return NULL;
  }
}

const char *zck__pk_kind_name(const zck_pk *n) {
  switch (n->kind) {
  case ZCK_PK_NONE: return "None"; case ZCK_PK_BOOL: return "bool"; case ZCK_PK_INT: case ZCK_PK_BIGINT: return "int";
  case ZCK_PK_FLOAT: return "float"; case ZCK_PK_STR: return "str"; case ZCK_PK_BYTES: return "bytes";
  case ZCK_PK_TUPLE: return "tuple"; case ZCK_PK_LIST: return "list"; case ZCK_PK_DICT: return "dict";
  case ZCK_PK_SET: return "set"; case ZCK_PK_GLOBAL: return "global"; case ZCK_PK_OBJECT: return "object";
  case ZCK_PK_PERSID: return "persistent id";
  }
  return "?";
}
