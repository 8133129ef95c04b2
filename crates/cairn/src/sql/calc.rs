//! A calc: a filter and a projection applied to each row, either by its own operator
//! ([`super::build`]'s `CalcFn`) or inside a source that reads only what it uses (the nexmark
//! source, [`super::connectors`]), with the same result.

use super::expr::Expr;
use super::types::Value;

/// A filter (None: every row passes) and the projection of the rows that pass it.
#[derive(Debug, Clone)]
pub struct Calc {
    filter: Option<Expr>,
    project: Vec<Expr>,
    /// Per projection, whether it moves its value out of the input row (see [`moves`]).
    moves: Vec<bool>,
    /// When every projection moves a column: those columns, in order.
    columns: Option<Vec<usize>>,
}

impl Calc {
    /// The calc of `filter` and `project`.
    pub fn new(filter: Option<Expr>, project: Vec<Expr>) -> Calc {
        let moves = moves(&project);
        let columns = project
            .iter()
            .zip(&moves)
            .map(|(e, m)| e.as_col().filter(|_| *m))
            .collect();
        Calc {
            moves,
            columns,
            filter,
            project,
        }
    }

    /// The filter, if any.
    pub fn filter(&self) -> Option<&Expr> {
        self.filter.as_ref()
    }

    /// How many values a projected row has.
    pub fn width(&self) -> usize {
        self.project.len()
    }

    /// Whether `row` passes the filter (a `NULL` condition does not).
    #[inline]
    pub fn passes(&self, row: &[Value]) -> Result<bool, String> {
        match &self.filter {
            Some(f) => f.test(row),
            None => Ok(true),
        }
    }

    /// Appends the projection of `row` to `out`, moving the values it may move out of `row`
    /// (which is then left with `NULL`s in their place).
    pub fn project_into(&self, row: &mut [Value], out: &mut Vec<Value>) -> Result<(), String> {
        if let Some(columns) = &self.columns {
            out.extend(columns.iter().map(|c| std::mem::take(&mut row[*c])));
            return Ok(());
        }
        // One pass in order: a value moves only if no other projection reads its column.
        // (Each value is written once, where it belongs: a placeholder overwritten later
        // costs a stalled load per value.)
        for (e, m) in self.project.iter().zip(&self.moves) {
            match place_mut(row, e).filter(|_| *m) {
                Some(v) => out.push(std::mem::take(v)),
                None => out.push(e.eval(row)?),
            }
        }
        Ok(())
    }
}

/// The value `e` reads in place: a column, or a field of one.
#[inline]
fn place_mut<'a>(row: &'a mut [Value], e: &Expr) -> Option<&'a mut Value> {
    match e {
        Expr::Col(i) => row.get_mut(*i),
        Expr::Field(inner, k) => match row.get_mut(inner.as_col()?)? {
            Value::Row(fields) => fields.get_mut(*k),
            _ => None,
        },
        _ => None,
    }
}

/// Which projections may move their value out of the row instead of cloning it: a column,
/// or a field of a column (`bid.price`), whose column no other projection reads.
fn moves(project: &[Expr]) -> Vec<bool> {
    let reads = |e: &Expr, col: usize| {
        let mut found = false;
        e.rewrite(&mut |x| {
            found |= x.as_col() == Some(col);
            None
        });
        found
    };
    project
        .iter()
        .enumerate()
        .map(|(j, e)| {
            let col = match e {
                Expr::Col(i) => *i,
                Expr::Field(inner, _) => match inner.as_col() {
                    Some(c) => c,
                    None => return false,
                },
                _ => return false,
            };
            project
                .iter()
                .enumerate()
                .all(|(k, x)| k == j || !reads(x, col))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(c: usize, k: usize) -> Expr {
        Expr::Field(Box::new(Expr::Col(c)), k)
    }

    #[test]
    fn a_column_or_field_moves_only_if_nothing_else_reads_its_column() {
        let project = [
            field(3, 0),
            field(3, 1),
            Expr::Col(0),
            field(3, 0),
            Expr::Col(1),
        ];
        assert_eq!(moves(&project), [false, false, true, false, true]);
        // A column another projection computes with does not move.
        let twice = Expr::Bin(
            super::super::expr::BinOp::Mul,
            Box::new(Expr::Col(0)),
            Box::new(Expr::Lit(Value::Int(2))),
            super::super::types::SqlType::BigInt,
        );
        assert_eq!(
            moves(&[Expr::Col(0), twice, Expr::Col(1)]),
            [false, false, true]
        );
        // The whole column and one of its fields: neither moves.
        assert_eq!(moves(&[Expr::Col(3), field(3, 1)]), [false, false]);
    }

    #[test]
    fn a_calc_moves_fields_out_of_a_row_and_keeps_the_rest() {
        let calc = Calc::new(
            None,
            vec![field(1, 1), field(1, 0), field(1, 1), Expr::Col(0)],
        );
        let row = |i: i64, s: &str| {
            let nested = Value::Row(vec![Value::Int(7 * i), Value::Str(s.into())].into());
            vec![Value::Int(i), nested]
        };
        let made = |i: i64, s: &str| {
            vec![
                Value::Str(s.into()),
                Value::Int(7 * i),
                Value::Str(s.into()),
                Value::Int(i),
            ]
        };
        // Two rows into one vector: the second is appended after the first.
        let mut out = Vec::new();
        calc.project_into(&mut row(1, "x"), &mut out).unwrap();
        assert_eq!(out, made(1, "x"));
        calc.project_into(&mut row(2, "y"), &mut out).unwrap();
        assert_eq!(out[4..], made(2, "y"));
        // A column and a value computed from it, in either order.
        let twice = Expr::Bin(
            super::super::expr::BinOp::Mul,
            Box::new(Expr::Col(0)),
            Box::new(Expr::Lit(Value::Int(2))),
            super::super::types::SqlType::BigInt,
        );
        for project in [vec![Expr::Col(0), twice.clone()], vec![twice, Expr::Col(0)]] {
            let calc = Calc::new(None, project.clone());
            let mut out = Vec::new();
            calc.project_into(&mut [Value::Int(21)], &mut out).unwrap();
            let want = project
                .iter()
                .map(|e| Value::Int(if e.as_col().is_some() { 21 } else { 42 }))
                .collect::<Vec<_>>();
            assert_eq!(out, want);
        }
    }

    #[test]
    fn a_row_passes_only_a_filter_that_is_true() {
        use super::super::expr::BinOp;
        use super::super::types::SqlType;
        let positive = Expr::Bin(
            BinOp::Gt,
            Box::new(Expr::Col(0)),
            Box::new(Expr::Lit(Value::Int(0))),
            SqlType::Boolean,
        );
        let calc = Calc::new(Some(positive), vec![Expr::Col(0)]);
        assert_eq!(calc.passes(&[Value::Int(1)]), Ok(true));
        assert_eq!(calc.passes(&[Value::Int(-1)]), Ok(false));
        assert_eq!(calc.passes(&[Value::Null]), Ok(false));
        assert_eq!(Calc::new(None, Vec::new()).passes(&[Value::Null]), Ok(true));
    }
}
