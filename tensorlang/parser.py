"""parser: tokens → syntax.Module, by recursive descent with precedence climbing (TC's grammar).

Error messages keep TC's wording ("expected ( but found '{'") and point at the offending token.
"""

from __future__ import annotations

from .errors import ParseError, Source, Span
from .lexer import TYPE_KEYWORDS, Token, tokenize
from .syntax import (
    ASSIGN_OPS,
    BINARY_PRECEDENCE,
    TERNARY_PRECEDENCE,
    UNARY_PRECEDENCE,
    Apply,
    BinaryOp,
    CastExpr,
    Def,
    Expression,
    Ident,
    Module,
    Name,
    Number,
    Param,
    Statement,
    TensorType,
    Ternary,
    UnaryOp,
    WhereClause,
    WhereExists,
    WhereLet,
    WhereRange,
)

# Two limits keep every later stage, which walks expressions recursively, far from Python's
# recursion limit (1000 frames by default). Nesting (parentheses, unary operators, `?:` branches,
# calls, casts, subscripts, the right operand of a tighter operator) is at most
# MAX_EXPRESSION_DEPTH levels. A chain of left-associative operators (`a + b + c ...`) is parsed
# in a loop and is not nesting, but it is a left-deep tree that later stages still descend one
# level per operator, so the height of the whole tree (chains and nesting together) is at most
# MAX_EXPRESSION_HEIGHT levels: a name or number is one level, `A(i)` two, and each operator adds
# one, so a flat sum of 199 terms `A(i) + A(i) + ...` is accepted and one of 200 is not. The
# deepest walk is the syntax printer (about 3.5 units of the recursion limit per level); the
# worst tree within both limits (98 nested calls around a chain) compiles, runs and prints every
# stage under a recursion limit of about 710, which leaves some 290 frames to the caller.
MAX_EXPRESSION_DEPTH = 100
MAX_EXPRESSION_HEIGHT = 200


def parse(source: Source) -> Module:
    """Parse a whole source file: one or more defs."""
    return _Parser(source).module()


class _Parser:
    def __init__(self, source: Source):
        self.source = source
        self.tokens = tokenize(source)
        self.pos = 0
        self.depth = 0  # current nesting of expressions being parsed
        self.height: dict[int, int] = {}  # id(node) → height of that expression tree

    # ------------------------------------------------------------ token helpers

    @property
    def cur(self) -> Token:
        return self.tokens[self.pos]

    def advance(self) -> Token:
        token = self.tokens[self.pos]
        if token.kind != "eof":
            self.pos += 1
        return token

    def next_if(self, kind: str) -> Token | None:
        return self.advance() if self.cur.kind == kind else None

    def expect(self, kind: str) -> Token:
        if self.cur.kind != kind:
            raise self.error(f"expected {kind} but found '{self.cur.describe()}'")
        return self.advance()

    def error(self, message: str, token: Token | None = None) -> ParseError:
        return ParseError(message, (token or self.cur).span)

    def span_from(self, start: Span) -> Span:
        """From `start` to the end of the last consumed token."""
        last = self.tokens[self.pos - 1] if self.pos > 0 else self.cur
        return start.to(last.span)

    def ident(self) -> Ident:
        token = self.expect("ident")
        return Ident(name=token.text, span=token.span)

    def comma_list(self, item, close: str) -> list:
        """`item {',' item}` up to and including `close`; the list may be empty."""
        items = []
        if self.next_if(close):
            return items
        while True:
            items.append(item())
            if self.next_if(close):
                return items
            if not self.next_if(","):
                raise self.error(f"expected {close} but found '{self.cur.describe()}'")

    # ------------------------------------------------------------ defs

    def module(self) -> Module:
        start = self.cur.span
        defs = [self.definition()]
        while self.cur.kind != "eof":
            defs.append(self.definition())
        return Module(defs=tuple(defs), span=self.span_from(start))

    def definition(self) -> Def:
        start = self.expect("def").span
        name = self.ident()
        self.expect("(")
        params = self.comma_list(self.param, ")")
        self.expect("->")
        self.expect("(")
        returns = self.comma_list(self.param, ")")
        self.expect("{")
        statements = []
        while not self.next_if("}"):
            statements.append(self.statement())
        return Def(
            name=name,
            params=tuple(params),
            returns=tuple(returns),
            statements=tuple(statements),
            span=self.span_from(start),
        )

    def param(self) -> Param:
        start = self.cur.span
        if self.cur.kind == "ident":
            name = self.ident()
            return Param(name=name, span=name.span)
        tensor_type = self.tensor_type()
        name = self.ident()
        return Param(name=name, type=tensor_type, span=self.span_from(start))

    def tensor_type(self) -> TensorType:
        token = self.cur
        if token.kind not in TYPE_KEYWORDS:
            raise self.error(f"expected a scalar type but found '{token.describe()}'")
        self.advance()
        dims = None
        if self.next_if("("):
            dims = tuple(self.comma_list(self.dim, ")"))
        return TensorType(type_name=token.text, dims=dims, span=self.span_from(token.span))

    def dim(self) -> Ident | Number:
        if self.cur.kind == "number":
            token = self.advance()
            return Number(text=token.text, span=token.span)
        return self.ident()

    # ------------------------------------------------------------ statements

    def statement(self) -> Statement:
        tensor = self.ident()
        indices: list[Ident | Expression] = []
        if self.next_if("("):
            indices = self.comma_list(self.lhs_subscript, ")")
        if self.cur.kind not in ASSIGN_OPS:
            raise self.error(f"expected a valid assignment operator but found '{self.cur.describe()}'")
        op = self.advance().kind
        rhs = self.expression()
        equivalent = None
        if self.next_if("<=>"):
            name = self.ident()
            paren = self.expect("(")
            args = self.comma_list(self.expression, ")")
            equivalent = Apply(name=name.name, args=tuple(args), span=name.span, paren_span=paren.span)
        wheres: list[WhereClause] = []
        if self.next_if("where"):
            wheres.append(self.where_clause())
            while self.next_if(","):
                wheres.append(self.where_clause())
        return Statement(
            tensor=tensor,
            indices=tuple(indices),
            op=op,
            rhs=rhs,
            equivalent=equivalent,
            wheres=tuple(wheres),
            span=self.span_from(tensor.span),
        )

    def lhs_subscript(self) -> Ident | Expression:
        """An index variable, or an expression (a scatter's data-dependent subscript, `idx(b)`;
        the checker says which expressions a left-hand side may hold). It starts with a name: for
        anything else (`B(0)`) TC's "expected ident" stands."""
        if self.cur.kind != "ident":
            return self.ident()
        expr = self.expression()
        if isinstance(expr, Name):
            return Ident(name=expr.name, span=expr.span)
        return expr

    def where_clause(self) -> WhereClause:
        start = self.cur.span
        if self.next_if("exists"):
            expr = self.expression()
            return WhereExists(expr=expr, span=self.span_from(start))
        var = self.ident()
        if self.next_if("="):
            value = self.expression()
            return WhereLet(var=var, value=value, span=self.span_from(start))
        self.expect("in")
        lo = self.expression()
        self.expect(":")
        hi = self.expression()
        return WhereRange(var=var, lo=lo, hi=hi, span=self.span_from(start))

    # ------------------------------------------------------------ expressions

    def expression(self, min_precedence: int = 0) -> Expression:
        self.depth += 1
        try:
            if self.depth > MAX_EXPRESSION_DEPTH:
                raise self.error(f"expression nested too deeply (more than {MAX_EXPRESSION_DEPTH} levels)")
            return self._climb(min_precedence)
        finally:
            self.depth -= 1

    def _climb(self, min_precedence: int) -> Expression:
        """`unary {op operand}`: a left-associative chain grows in this loop, not by recursion."""
        lhs = self.unary()
        while True:
            token = self.cur
            if token.kind == "?" and TERNARY_PRECEDENCE >= min_precedence:
                self.advance()
                if_true = self.expression(0)
                self.expect(":")
                # Right-associative: the false branch may itself be a ternary.
                if_false = self.expression(TERNARY_PRECEDENCE)
                lhs = self.node(
                    Ternary(cond=lhs, if_true=if_true, if_false=if_false, span=self.span_from(lhs.span)),
                    lhs,
                    if_true,
                    if_false,
                    at=token,
                )
            elif BINARY_PRECEDENCE.get(token.kind, -1) >= min_precedence:
                self.advance()
                rhs = self.expression(BINARY_PRECEDENCE[token.kind] + 1)  # left-associative
                lhs = self.node(
                    BinaryOp(op=token.kind, lhs=lhs, rhs=rhs, span=self.span_from(lhs.span)),
                    lhs,
                    rhs,
                    at=token,
                )
            else:
                return lhs

    def unary(self) -> Expression:
        token = self.cur
        if token.kind in ("-", "!"):
            self.advance()
            operand = self.expression(UNARY_PRECEDENCE)
            return self.node(
                UnaryOp(op=token.kind, operand=operand, span=self.span_from(token.span)), operand
            )
        return self.base()

    def base(self) -> Expression:
        token = self.cur
        if token.kind == "number":
            self.advance()
            return Number(text=token.text, span=token.span)
        if token.kind == "(":
            self.advance()
            inner = self.expression()
            self.expect(")")
            return inner
        if token.kind in TYPE_KEYWORDS:
            self.advance()
            self.expect("(")
            operand = self.expression()
            self.expect(")")
            cast = CastExpr(type_name=token.text, operand=operand, span=self.span_from(token.span))
            return self.node(cast, operand)
        if token.kind in ("min", "max"):
            self.advance()
            self.expect("(")
            a = self.expression()
            self.expect(",")
            b = self.expression()
            self.expect(")")
            return self.node(BinaryOp(op=token.kind, lhs=a, rhs=b, span=self.span_from(token.span)), a, b)
        name = self.ident()  # TC's message for anything else: "expected ident but found ..."
        if self.cur.kind != "(":
            return Name(name=name.name, span=name.span)
        paren = self.advance()
        args = self.comma_list(self.expression, ")")
        apply = Apply(name=name.name, args=tuple(args), span=self.span_from(name.span), paren_span=paren.span)
        return self.node(apply, *args)

    def node(self, node: Expression, *children: Expression, at: Token | None = None) -> Expression:
        """Record the height of `node`: long operator chains are deep trees without deep parsing.

        `at` is the operator token that joins the children (the error points there), else the node.
        """
        height = 1 + max((self.height.get(id(c), 1) for c in children), default=0)
        if height > MAX_EXPRESSION_HEIGHT:
            raise ParseError(
                f"expression too long: more than {MAX_EXPRESSION_HEIGHT} levels deep (each operator "
                f"of a chain a + b + ... is a level); compute part of it in a temporary tensor",
                at.span if at is not None else node.span,
            )
        self.height[id(node)] = height
        return node
