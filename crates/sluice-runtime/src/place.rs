//! Where an operator sits in a plan, and the stable id its state is stored under in every
//! checkpoint manifest (so the id's text is an encoding that lasts: never change its form).
//! Below both the plan, which names an id's operator for `explain`, and the checkpoint
//! protocol, which keys state by it.

/// Where a segment sits in the plan: segment `segment` of flow `flow`'s trunk, or of its
/// side input `side` (counted within that side, so a segment the trunk gains, such as
/// a gather before a single-writer sink, never renumbers a side's segments).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentPlace {
    pub flow: usize,
    pub side: Option<usize>,
    pub segment: usize,
}

/// The stable id of operator `operator` of the segment at `place`, under which its state
/// is stored: `flow{F}/segment{S}/operator{O}` in a trunk,
/// `flow{F}/side{I}/segment{S}/operator{O}` in side input `I`.
pub fn operator_id(place: SegmentPlace, operator: usize) -> String {
    let SegmentPlace { flow, side, segment } = place;
    match side {
        None => format!("flow{flow}/segment{segment}/operator{operator}"),
        Some(side) => format!("flow{flow}/side{side}/segment{segment}/operator{operator}"),
    }
}

/// The place and operator of an [`operator_id`].
pub fn parse_operator_id(id: &str) -> Option<(SegmentPlace, usize)> {
    let mut parts = id.split('/').peekable();
    let flow = parts.next()?.strip_prefix("flow")?.parse().ok()?;
    let side = match parts.peek()?.strip_prefix("side") {
        Some(side) => {
            let side = side.parse().ok()?;
            parts.next();
            Some(side)
        }
        None => None,
    };
    let segment = parts.next()?.strip_prefix("segment")?.parse().ok()?;
    let operator = parts.next()?.strip_prefix("operator")?.parse().ok()?;
    parts.next().is_none().then_some((SegmentPlace { flow, side, segment }, operator))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operator_ids_are_stable_text_and_parse_back() {
        let trunk = SegmentPlace { flow: 2, side: None, segment: 1 };
        let side = SegmentPlace { flow: 0, side: Some(1), segment: 0 };
        assert_eq!(operator_id(trunk, 3), "flow2/segment1/operator3", "the form manifests already hold");
        assert_eq!(operator_id(side, 0), "flow0/side1/segment0/operator0");
        assert_eq!(parse_operator_id("flow2/segment1/operator3"), Some((trunk, 3)));
        assert_eq!(parse_operator_id("flow0/side1/segment0/operator0"), Some((side, 0)));
        for bad in ["flow0/segment1", "flow0/side/segment0/operator0", "flow0/segment1/operator2/x", "x"] {
            assert_eq!(parse_operator_id(bad), None, "{bad}");
        }
    }
}
