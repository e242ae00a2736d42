//! Index-addressed storage whose freed indexes are reused: heap nodes, regions, slabs, and the
//! native emulation's blocks all keep a `Vec` of items and a list of indexes free for reuse.

/// Puts `item` at the index most recently added to `free` (taking it off the list), or at the end
/// of `items` when none is free; returns its index.
pub fn reuse_or_push<T>(items: &mut Vec<T>, free: &mut Vec<u32>, item: T) -> u32 {
    match free.pop() {
        Some(i) => {
            items[i as usize] = item;
            i
        }
        None => {
            items.push(item);
            u32::try_from(items.len() - 1).expect("fewer than 2^32 items")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_freed_index_is_reused_before_the_vec_grows() {
        let (mut items, mut free) = (Vec::new(), Vec::new());
        assert_eq!(reuse_or_push(&mut items, &mut free, 'a'), 0);
        assert_eq!(reuse_or_push(&mut items, &mut free, 'b'), 1);
        free.push(0);
        assert_eq!(reuse_or_push(&mut items, &mut free, 'c'), 0);
        assert_eq!((items, free.len()), (vec!['c', 'b'], 0));
    }
}
