//! Flink's SQL dialect on sqlparser: the statements of a script, with Flink's DDL (computed
//! columns, `WATERMARK FOR`, `WITH ('connector' = …)`, `ROW<…>` types), `SET 'key' = 'value'`
//! and statement sets parsed here, and queries and expressions by sqlparser's generic dialect.
//!
//! The window table-valued functions' table argument (`TUMBLE(TABLE bid, …)`, `SESSION(TABLE
//! bid PARTITION BY bidder, …)`) is not SQL sqlparser knows: the token stream is rewritten
//! before parsing so that it reads as a call `__cairn_table_arg(bid[, bidder])`.

use std::collections::BTreeMap;

use sqlparser::ast;
use sqlparser::dialect::GenericDialect;
use sqlparser::keywords::Keyword;
use sqlparser::parser::{Parser, ParserError};
use sqlparser::tokenizer::{Location, Span, Token, TokenWithSpan, Tokenizer, Word};

use super::types::SqlType;
use super::SqlError;

/// The name the table argument of a window function is rewritten to.
pub(crate) const TABLE_ARG: &str = "__cairn_table_arg";

/// A statement of a script.
#[derive(Debug, Clone)]
pub enum Statement {
    /// `CREATE [TEMPORARY] TABLE`.
    CreateTable(Box<TableDef>),
    /// `CREATE [TEMPORARY] VIEW name AS query`.
    CreateView {
        /// Its name.
        name: String,
        /// Its query.
        query: Box<ast::Query>,
        /// Where it starts.
        at: Location,
    },
    /// `SET 'key' = 'value'`.
    Set {
        /// The configuration key.
        key: String,
        /// Its value.
        value: String,
        /// Where it starts.
        at: Location,
    },
    /// `INSERT INTO table query`, alone or in a statement set.
    Insert(Insert),
    /// A query on its own: its rows are printed.
    Query(Box<ast::Query>, Location),
    /// `BEGIN STATEMENT SET; INSERT …; END;` or `EXECUTE STATEMENT SET BEGIN … END;`.
    StatementSet(Vec<Insert>, Location),
    /// `EXPLAIN statement`.
    Explain(Box<Statement>),
}

/// `INSERT INTO table query`.
#[derive(Debug, Clone)]
pub struct Insert {
    /// The table written to.
    pub table: String,
    /// The rows written.
    pub query: Box<ast::Query>,
    /// Where the statement starts.
    pub at: Location,
}

/// A column of `CREATE TABLE`.
#[derive(Debug, Clone)]
pub enum ColumnDef {
    /// `name type`.
    Physical(String, SqlType),
    /// `name AS expression`.
    Computed(String, Box<ast::Expr>),
}

impl ColumnDef {
    /// The column's name.
    pub fn name(&self) -> &str {
        match self {
            ColumnDef::Physical(n, _) | ColumnDef::Computed(n, _) => n,
        }
    }
}

/// `CREATE TABLE name (…) WITH (…)`.
#[derive(Debug, Clone)]
pub struct TableDef {
    /// Its name.
    pub name: String,
    /// Its columns in order.
    pub columns: Vec<ColumnDef>,
    /// `WATERMARK FOR column AS expression`.
    pub watermark: Option<(String, ast::Expr)>,
    /// `PRIMARY KEY (…) NOT ENFORCED`.
    pub primary_key: Vec<String>,
    /// The `WITH` options.
    pub options: BTreeMap<String, String>,
    /// Where the statement starts.
    pub at: Location,
}

/// Parses a script into its statements.
pub fn parse_script(sql: &str) -> Result<Vec<Statement>, SqlError> {
    let dialect = GenericDialect {};
    let tokens = Tokenizer::new(&dialect, sql)
        .tokenize_with_location()
        .map_err(|e| SqlError::syntax(e.to_string()))?;
    let tokens = rewrite_table_args(tokens);
    let mut parser = Parser::new(&dialect).with_tokens_with_locations(tokens);
    let mut statements = Vec::new();
    loop {
        while parser.consume_token(&Token::SemiColon) {}
        if parser.peek_token().token == Token::EOF {
            break;
        }
        statements.push(
            statement(&mut parser)
                .map_err(|e| at_end_if_unplaced(SqlError::from_parser(e), sql))?,
        );
        let next = parser.peek_token();
        if !matches!(next.token, Token::SemiColon | Token::EOF) {
            return Err(SqlError::at(
                next.span.start,
                format!("expected ';' after the statement, found {}", next.token),
            ));
        }
    }
    Ok(statements)
}

/// An error without a place (the parser ran into the end of the script) is placed there.
fn at_end_if_unplaced(mut e: SqlError, sql: &str) -> SqlError {
    if e.at.is_none() {
        let line = sql.lines().count().max(1);
        let column = sql.lines().last().map_or(0, |l| l.chars().count()) + 1;
        e.at = Some((line as u64, column as u64));
        e.message = e
            .message
            .replace("found: EOF", "found the end of the script");
    }
    e
}

fn word_is(token: &Token, text: &str) -> bool {
    matches!(token, Token::Word(w) if w.quote_style.is_none() && w.value.eq_ignore_ascii_case(text))
}

fn statement(p: &mut Parser) -> Result<Statement, ParserError> {
    let at = p.peek_token().span.start;
    if p.parse_keyword(Keyword::EXPLAIN) {
        // `EXPLAIN PLAN FOR …` is Flink's long form.
        let _ = p.parse_keywords(&[Keyword::PLAN, Keyword::FOR]);
        return Ok(Statement::Explain(Box::new(statement(p)?)));
    }
    if p.parse_keyword(Keyword::CREATE) {
        let _ = p.parse_keyword(Keyword::TEMPORARY);
        if p.parse_keyword(Keyword::TABLE) {
            return create_table(p, at).map(|t| Statement::CreateTable(Box::new(t)));
        }
        if p.parse_keyword(Keyword::VIEW) {
            let name = object_name(p)?;
            p.expect_keyword_is(Keyword::AS)?;
            let query = p.parse_query()?;
            return Ok(Statement::CreateView { name, query, at });
        }
        return p.expected("TABLE or VIEW after CREATE", p.peek_token());
    }
    if p.parse_keyword(Keyword::SET) {
        return set(p, at);
    }
    if p.parse_keywords(&[Keyword::BEGIN, Keyword::STATEMENT, Keyword::SET]) {
        p.expect_token(&Token::SemiColon)?;
        return statement_set(p, at);
    }
    if p.parse_keywords(&[Keyword::EXECUTE, Keyword::STATEMENT, Keyword::SET]) {
        p.expect_keyword_is(Keyword::BEGIN)?;
        return statement_set(p, at);
    }
    if p.peek_keyword(Keyword::INSERT) {
        return insert(p).map(Statement::Insert);
    }
    if p.peek_keyword(Keyword::SELECT)
        || p.peek_keyword(Keyword::WITH)
        || p.peek_token().token == Token::LParen
    {
        return Ok(Statement::Query(p.parse_query()?, at));
    }
    let other = p.parse_statement()?;
    let text = other.to_string();
    let words: Vec<&str> = text.split_whitespace().take(2).collect();
    Err(ParserError::ParserError(format!(
        "the statement {} is not supported (supported: CREATE TABLE, CREATE VIEW, SET, INSERT INTO, SELECT, statement sets, EXPLAIN) at Line: {}, Column: {}",
        words.join(" "),
        at.line,
        at.column
    )))
}

fn statement_set(p: &mut Parser, at: Location) -> Result<Statement, ParserError> {
    let mut inserts = Vec::new();
    loop {
        while p.consume_token(&Token::SemiColon) {}
        if p.parse_keyword(Keyword::END) {
            break;
        }
        if p.peek_token().token == Token::EOF {
            return p.expected("END of the statement set", p.peek_token());
        }
        if !p.peek_keyword(Keyword::INSERT) {
            return p.expected("INSERT INTO in the statement set", p.peek_token());
        }
        inserts.push(insert(p)?);
        p.expect_token(&Token::SemiColon)?;
    }
    if inserts.is_empty() {
        return Err(ParserError::ParserError(format!(
            "the statement set is empty at Line: {}, Column: {}",
            at.line, at.column
        )));
    }
    Ok(Statement::StatementSet(inserts, at))
}

fn insert(p: &mut Parser) -> Result<Insert, ParserError> {
    let at = p.peek_token().span.start;
    p.expect_keyword_is(Keyword::INSERT)?;
    if !p.parse_keyword(Keyword::INTO) {
        return p.expected("INTO (INSERT OVERWRITE is not supported)", p.peek_token());
    }
    let table = object_name(p)?;
    if p.peek_token().token == Token::LParen {
        return p.expected(
            "a query (a column list after the table name is not supported)",
            p.peek_token(),
        );
    }
    let query = p.parse_query()?;
    Ok(Insert { table, query, at })
}

fn set(p: &mut Parser, at: Location) -> Result<Statement, ParserError> {
    let key = match p.next_token().token {
        Token::SingleQuotedString(s) => s,
        Token::Word(w) => {
            // An unquoted dotted key: `SET table.exec.state.ttl = …`.
            let mut key = w.value;
            while p.consume_token(&Token::Period) {
                key.push('.');
                key.push_str(&p.parse_identifier()?.value);
            }
            key
        }
        _ => {
            p.prev_token();
            return p.expected("a quoted configuration key after SET", p.peek_token());
        }
    };
    p.expect_token(&Token::Eq)?;
    let value = literal_text(p)?;
    Ok(Statement::Set { key, value, at })
}

/// A string, number or word as its text.
fn literal_text(p: &mut Parser) -> Result<String, ParserError> {
    let t = p.next_token();
    match t.token {
        Token::SingleQuotedString(s) | Token::DoubleQuotedString(s) => Ok(s),
        Token::Number(n, _) => Ok(n),
        Token::Word(w) => Ok(w.value),
        _ => p.expected("a quoted value", t),
    }
}

fn object_name(p: &mut Parser) -> Result<String, ParserError> {
    let name = p.parse_object_name(false)?;
    Ok(name
        .0
        .iter()
        .map(|part| part.to_string().trim_matches(['`', '"']).to_string())
        .collect::<Vec<_>>()
        .join("."))
}

fn create_table(p: &mut Parser, at: Location) -> Result<TableDef, ParserError> {
    let _ = p.parse_keywords(&[Keyword::IF, Keyword::NOT, Keyword::EXISTS]);
    let name = object_name(p)?;
    p.expect_token(&Token::LParen)?;
    let mut columns = Vec::new();
    let mut watermark = None;
    let mut primary_key = Vec::new();
    loop {
        let t = p.peek_token();
        if word_is(&t.token, "WATERMARK") {
            p.next_token();
            p.expect_keyword_is(Keyword::FOR)?;
            let column = p.parse_identifier()?.value;
            p.expect_keyword_is(Keyword::AS)?;
            watermark = Some((column, p.parse_expr()?));
        } else if p.parse_keyword(Keyword::CONSTRAINT) {
            p.parse_identifier()?;
            primary_key = primary_key_clause(p)?;
        } else if p.peek_keyword(Keyword::PRIMARY) {
            primary_key = primary_key_clause(p)?;
        } else {
            let column = p.parse_identifier()?.value;
            if p.parse_keyword(Keyword::AS) {
                columns.push(ColumnDef::Computed(column, Box::new(p.parse_expr()?)));
            } else {
                let ty = data_type(p)?;
                let _ = p.parse_keywords(&[Keyword::NOT, Keyword::NULL])
                    || p.parse_keyword(Keyword::NULL);
                let next = p.peek_token();
                if word_is(&next.token, "METADATA") {
                    return Err(ParserError::ParserError(format!(
                        "metadata columns are not supported at Line: {}, Column: {}",
                        next.span.start.line, next.span.start.column
                    )));
                }
                if p.parse_keywords(&[Keyword::PRIMARY, Keyword::KEY]) {
                    p.expect_keywords(&[Keyword::NOT, Keyword::ENFORCED])?;
                    primary_key = vec![column.clone()];
                }
                columns.push(ColumnDef::Physical(column, ty));
            }
        }
        if p.consume_token(&Token::RParen) {
            break;
        }
        p.expect_token(&Token::Comma)?;
    }
    if p.parse_keyword(Keyword::COMMENT) {
        p.parse_literal_string()?;
    }
    if p.peek_keyword(Keyword::PARTITIONED) {
        return p.expected("WITH (PARTITIONED BY is not supported)", p.peek_token());
    }
    let mut options = BTreeMap::new();
    if p.parse_keyword(Keyword::WITH) {
        p.expect_token(&Token::LParen)?;
        loop {
            let key = literal_text(p)?;
            p.expect_token(&Token::Eq)?;
            let value = literal_text(p)?;
            options.insert(key, value);
            if p.consume_token(&Token::RParen) {
                break;
            }
            p.expect_token(&Token::Comma)?;
        }
    }
    Ok(TableDef {
        name,
        columns,
        watermark,
        primary_key,
        options,
        at,
    })
}

fn primary_key_clause(p: &mut Parser) -> Result<Vec<String>, ParserError> {
    p.expect_keywords(&[Keyword::PRIMARY, Keyword::KEY])?;
    p.expect_token(&Token::LParen)?;
    let mut keys = vec![p.parse_identifier()?.value];
    while p.consume_token(&Token::Comma) {
        keys.push(p.parse_identifier()?.value);
    }
    p.expect_token(&Token::RParen)?;
    p.expect_keywords(&[Keyword::NOT, Keyword::ENFORCED])?;
    Ok(keys)
}

/// Parses a type in Flink's spelling.
pub fn data_type(p: &mut Parser) -> Result<SqlType, ParserError> {
    let t = p.next_token();
    let Token::Word(w) = &t.token else {
        return p.expected("a type", t);
    };
    let name = w.value.to_ascii_uppercase();
    let unsupported = |what: &str| {
        Err(ParserError::ParserError(format!(
            "the type {what} is not supported (supported: BOOLEAN, INT, BIGINT, DOUBLE, DECIMAL, STRING/VARCHAR, TIMESTAMP(3), TIMESTAMP_LTZ(3), ROW) at Line: {}, Column: {}",
            t.span.start.line, t.span.start.column
        )))
    };
    let ty = match name.as_str() {
        "BOOLEAN" | "BOOL" => SqlType::Boolean,
        "TINYINT" | "SMALLINT" | "INT" | "INTEGER" => SqlType::Int,
        "BIGINT" => SqlType::BigInt,
        "FLOAT" | "REAL" => SqlType::Double,
        "DOUBLE" => {
            let _ = p.parse_keyword(Keyword::PRECISION);
            SqlType::Double
        }
        "DECIMAL" | "DEC" | "NUMERIC" => {
            let (precision, scale) = match type_args(p)?.as_slice() {
                [] => (10, 0),
                [p] => (*p, 0),
                [p, s, ..] => (*p, *s),
            };
            if precision == 0 || precision > 38 || scale > precision {
                return Err(ParserError::ParserError(format!(
                    "DECIMAL({precision}, {scale}) is not a valid decimal type (precision 1 to 38, scale at most the precision) at Line: {}, Column: {}",
                    t.span.start.line, t.span.start.column
                )));
            }
            SqlType::Decimal(precision as u8, scale as u8)
        }
        "STRING" => SqlType::String,
        "VARCHAR" | "CHAR" => {
            type_args(p)?;
            SqlType::String
        }
        "CHARACTER" => {
            let _ = p.parse_keyword(Keyword::VARYING);
            type_args(p)?;
            SqlType::String
        }
        "TIMESTAMP" => {
            type_args(p)?;
            if p.parse_keywords(&[Keyword::WITH, Keyword::LOCAL, Keyword::TIME, Keyword::ZONE]) {
                SqlType::Timestamp { ltz: true }
            } else {
                let _ = p.parse_keywords(&[Keyword::WITHOUT, Keyword::TIME, Keyword::ZONE]);
                SqlType::Timestamp { ltz: false }
            }
        }
        "TIMESTAMP_LTZ" => {
            type_args(p)?;
            SqlType::Timestamp { ltz: true }
        }
        "ROW" => {
            let close = if p.consume_token(&Token::Lt) {
                Token::Gt
            } else {
                p.expect_token(&Token::LParen)?;
                Token::RParen
            };
            let mut fields = Vec::new();
            loop {
                let name = p.parse_identifier()?.value;
                let ty = data_type(p)?;
                fields.push((name, ty));
                if p.consume_token(&close) {
                    break;
                }
                // `>>` closes two nested rows.
                if close == Token::Gt && p.peek_token().token == Token::ShiftRight {
                    return p.expected(
                        "'> >' (write nested ROW types' closing brackets apart)",
                        p.peek_token(),
                    );
                }
                p.expect_token(&Token::Comma)?;
            }
            SqlType::Row(fields)
        }
        other => return unsupported(other),
    };
    Ok(ty)
}

/// `(n[, m])` after a type name, if present.
fn type_args(p: &mut Parser) -> Result<Vec<u32>, ParserError> {
    let mut args = Vec::new();
    if p.consume_token(&Token::LParen) {
        loop {
            let t = p.next_token();
            match &t.token {
                Token::Number(n, _) => args.push(n.parse().map_err(|_| {
                    ParserError::ParserError(format!("'{n}' is not a type length"))
                })?),
                _ => return p.expected("a number", t),
            }
            if p.consume_token(&Token::RParen) {
                break;
            }
            p.expect_token(&Token::Comma)?;
        }
    }
    Ok(args)
}

/// Parses a type's text (a `CAST` target as sqlparser prints it).
pub fn parse_type_text(text: &str) -> Result<SqlType, String> {
    let dialect = GenericDialect {};
    let mut p = Parser::new(&dialect)
        .try_with_sql(text)
        .map_err(|e| e.to_string())?;
    data_type(&mut p).map_err(|e| e.to_string())
}

/// Rewrites `TABLE name [PARTITION BY keys]` inside a call into `__cairn_table_arg(name[,
/// keys])`.
fn rewrite_table_args(tokens: Vec<TokenWithSpan>) -> Vec<TokenWithSpan> {
    let significant = |t: &TokenWithSpan| !matches!(t.token, Token::Whitespace(_));
    let mut out: Vec<TokenWithSpan> = Vec::with_capacity(tokens.len() + 8);
    let mut i = 0;
    while i < tokens.len() {
        let t = &tokens[i];
        let after_open = out
            .iter()
            .rev()
            .find(|t| significant(t))
            .is_some_and(|p| matches!(p.token, Token::LParen | Token::Comma));
        let is_table = matches!(&t.token, Token::Word(w) if w.keyword == Keyword::TABLE);
        if !(is_table && after_open) {
            out.push(t.clone());
            i += 1;
            continue;
        }
        let span = t.span;
        out.push(synthetic(
            Token::Word(Word {
                value: TABLE_ARG.into(),
                quote_style: None,
                keyword: Keyword::NoKeyword,
            }),
            span,
        ));
        out.push(synthetic(Token::LParen, span));
        i += 1;
        // The name: words and periods.
        while i < tokens.len()
            && (matches!(tokens[i].token, Token::Word(_) | Token::Period)
                || !significant(&tokens[i]))
        {
            if word_is(&tokens[i].token, "PARTITION") {
                break;
            }
            out.push(tokens[i].clone());
            i += 1;
        }
        if i < tokens.len() && word_is(&tokens[i].token, "PARTITION") {
            let by = tokens[i + 1..]
                .iter()
                .position(significant)
                .map(|k| i + 1 + k);
            if let Some(by) = by
                .filter(|&k| matches!(&tokens[k].token, Token::Word(w) if w.keyword == Keyword::BY))
            {
                out.push(synthetic(Token::Comma, tokens[i].span));
                i = by + 1;
                let mut depth = 0i32;
                while i < tokens.len() {
                    match tokens[i].token {
                        Token::LParen => depth += 1,
                        Token::RParen if depth == 0 => break,
                        Token::RParen => depth -= 1,
                        Token::Comma if depth == 0 => break,
                        _ => {}
                    }
                    out.push(tokens[i].clone());
                    i += 1;
                }
            }
        }
        out.push(synthetic(Token::RParen, span));
    }
    out
}

fn synthetic(token: Token, span: Span) -> TokenWithSpan {
    TokenWithSpan::new(token, span)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flink_ddl_parses_with_computed_columns_watermark_and_options() {
        let script = "CREATE TABLE bid (auction BIGINT, person ROW<id BIGINT, name VARCHAR>, ts TIMESTAMP(3), t2 AS ts, WATERMARK FOR ts AS ts - INTERVAL '4' SECOND, PRIMARY KEY (auction) NOT ENFORCED) WITH ('connector' = 'nexmark', 'events.num' = '100');\nSET 'parallelism.default' = '2';";
        let statements = parse_script(script).unwrap();
        let Statement::CreateTable(t) = &statements[0] else {
            panic!()
        };
        assert_eq!(t.columns.len(), 4);
        assert_eq!(t.columns[1].name(), "person");
        assert!(matches!(&t.columns[1], ColumnDef::Physical(_, SqlType::Row(f)) if f.len() == 2));
        assert!(matches!(&t.columns[3], ColumnDef::Computed(n, _) if n == "t2"));
        assert_eq!(t.watermark.as_ref().unwrap().0, "ts");
        assert_eq!(t.primary_key, vec!["auction".to_string()]);
        assert_eq!(t.options["connector"], "nexmark");
        assert!(
            matches!(&statements[1], Statement::Set { key, value, .. } if key == "parallelism.default" && value == "2")
        );
    }

    #[test]
    fn window_functions_table_arguments_parse() {
        let statements = parse_script(
            "SELECT * FROM TABLE(SESSION(TABLE bid PARTITION BY bidder, DESCRIPTOR(ts), INTERVAL '10' SECOND))",
        )
        .unwrap();
        let Statement::Query(q, _) = &statements[0] else {
            panic!()
        };
        assert!(
            q.to_string().contains("__cairn_table_arg(bid, bidder)"),
            "{q}"
        );
    }

    #[test]
    fn statement_sets_and_explain_parse() {
        let s = parse_script(
            "EXPLAIN BEGIN STATEMENT SET; INSERT INTO a SELECT 1; INSERT INTO b SELECT 2; END;",
        )
        .unwrap();
        assert!(
            matches!(&s[0], Statement::Explain(inner) if matches!(**inner, Statement::StatementSet(ref v, _) if v.len() == 2))
        );
        let s = parse_script("EXECUTE STATEMENT SET BEGIN INSERT INTO a SELECT 1; END").unwrap();
        assert!(matches!(&s[0], Statement::StatementSet(v, _) if v.len() == 1));
    }

    #[test]
    fn syntax_errors_name_line_and_column() {
        let e = parse_script("SELECT a\nFROM t WHERE").unwrap_err();
        assert!(e.to_string().contains("line 2"), "{e}");
        let e = parse_script("DROP TABLE t").unwrap_err();
        assert!(e.to_string().contains("not supported"), "{e}");
    }
}
